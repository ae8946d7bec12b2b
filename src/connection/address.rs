//! Where a provider kubeconfig's server may be reached: never a link-local or cloud metadata
//! address, and always the address that was checked (docs/schema.md "Refused addresses").

use std::net::IpAddr;
use std::time::Duration;

use kube::Config;

use super::CredentialError;
use super::kubeconfig::{ProviderKubeconfig, current};

/// Link-local and cloud metadata addresses (docs/hostile-inputs.md): shared with every
/// upstream client.
pub use crate::upstream::address::is_forbidden as is_forbidden_address;

/// Check where the server's host resolves before any request is made: a link-local or metadata
/// address is refused. `Ok(Some(ip))`: the host is a name, and `ip` (IPv4 first, as resolved
/// otherwise) is where the client is to connect. A name that does not resolve is left to the
/// connection attempt, which reports it as usual.
pub async fn check_server_address(
    pk: &ProviderKubeconfig,
) -> Result<Option<IpAddr>, CredentialError> {
    let (cluster, _) = current(&pk.kubeconfig);
    let Some(uri) = cluster
        .and_then(|c| c.server.as_deref())
        .and_then(|s| s.parse::<http::Uri>().ok())
    else {
        return Ok(None);
    };
    let Some(host) = uri.host() else {
        return Ok(None);
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    let (addrs, named): (Vec<IpAddr>, bool) = match host.parse::<IpAddr>() {
        Ok(ip) => (vec![ip], false),
        Err(_) => match tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::lookup_host((host, port)),
        )
        .await
        {
            Ok(Ok(found)) => (found.map(|a| a.ip()).collect(), true),
            _ => return Ok(None),
        },
    };
    if let Some(ip) = addrs.iter().find(|ip| is_forbidden_address(**ip)) {
        return Err(CredentialError::FieldNotAllowed {
            namespace: pk.secret.0.clone(),
            name: pk.secret.1.clone(),
            what: format!(
                "cluster.server resolves to {ip}, a link-local or cloud metadata address; refused"
            ),
        });
    }
    let first = addrs
        .iter()
        .find(|ip| ip.is_ipv4())
        .or(addrs.first())
        .copied();
    Ok(first.filter(|_| named))
}

/// Make `config` connect to `ip` instead of resolving its server's host again: the URL's host
/// becomes the address, TLS still verifies (and SNI still names) the host, and requests still
/// carry it as `Host`. Left alone behind a proxy (the proxy resolves) or for an address.
pub fn pin_to(config: &mut Config, ip: IpAddr) {
    let uri = config.cluster_url.clone();
    let Some(host) = uri.host().map(str::to_string) else {
        return;
    };
    if config.proxy_url.is_some()
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok()
    {
        return;
    }
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    let addr = match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    };
    let mut parts = uri.into_parts();
    let Ok(authority) = addr.parse() else {
        return;
    };
    parts.authority = Some(authority);
    let Ok(pinned) = http::Uri::from_parts(parts) else {
        return;
    };
    let host_header = match config.cluster_url.port_u16() {
        Some(p) => format!("{host}:{p}"),
        None => host.clone(),
    };
    if let Ok(v) = http::HeaderValue::from_str(&host_header) {
        config.headers.retain(|(k, _)| k != http::header::HOST);
        config.headers.push((http::header::HOST, v));
    }
    config.tls_server_name.get_or_insert(host);
    config.cluster_url = pinned;
}
