//! Where no request of kbind's goes: link-local and cloud metadata addresses. A provider's
//! apiserver, a directory or SpiceDB is never there, and an answer read back from one would
//! carry the machine's own credentials into a status (docs/hostile-inputs.md).
//!
//! IP literals are refused where a destination is parsed (the kubeconfig check, relsync's
//! allowedHosts); names are refused by [`Refusing`], the resolver of every upstream client, so
//! the address checked is the address connected to (no window for a DNS answer that changes
//! between the check and the connection).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Link-local (169.254.0.0/16, fe80::/10, and their IPv4-mapped forms) and the cloud metadata
/// addresses outside them.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_link_local() // 169.254.0.0/16: AWS, GCP, Azure, OpenStack metadata
                || v4 == Ipv4Addr::new(100, 100, 100, 200) // Alibaba Cloud metadata
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_forbidden(IpAddr::V4(v4)),
            None => {
                (v6.segments()[0] & 0xffc0) == 0xfe80 // fe80::/10 link-local
                    || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) // AWS IPv6 metadata
            }
        },
    }
}

/// A name resolved to a forbidden address.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves to {ip}, a link-local or cloud metadata address; refused")]
pub struct Forbidden {
    pub host: String,
    pub ip: IpAddr,
}

/// The addresses `host` resolved to, or [`Forbidden`] if any of them is forbidden (one bad
/// answer refuses the name: a client would otherwise try it when the others fail).
pub fn admit(host: &str, addrs: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, Forbidden> {
    match addrs
        .iter()
        .map(SocketAddr::ip)
        .find(|ip| is_forbidden(*ip))
    {
        Some(ip) => Err(Forbidden {
            host: host.to_string(),
            ip,
        }),
        None => Ok(addrs),
    }
}

/// The system resolver, refusing names that resolve to a forbidden address.
pub struct Refusing;

impl reqwest::dns::Resolve for Refusing {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let addrs = admit(&host, found)?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_addresses() {
        for (ip, forbidden) in [
            ("169.254.169.254", true),
            ("169.254.1.1", true),
            ("100.100.100.200", true),
            ("fe80::1", true),
            ("::ffff:169.254.169.254", true),
            ("fd00:ec2::254", true),
            ("127.0.0.1", false),
            ("10.0.0.1", false),
            ("::1", false),
            ("2001:db8::1", false),
        ] {
            assert_eq!(is_forbidden(ip.parse().unwrap()), forbidden, "{ip}");
        }
    }

    #[test]
    fn a_name_with_one_forbidden_answer_is_refused() {
        let ok: SocketAddr = "10.0.0.1:0".parse().unwrap();
        let bad: SocketAddr = "169.254.169.254:0".parse().unwrap();
        assert_eq!(admit("scim.example.com", vec![ok]).unwrap(), vec![ok]);
        let e = admit("scim.example.com", vec![ok, bad]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "scim.example.com resolves to 169.254.169.254, a link-local or cloud metadata address; refused"
        );
    }

    /// The resolver every upstream client uses answers for an ordinary name.
    #[tokio::test]
    async fn the_resolver_answers_for_loopback() {
        use reqwest::dns::Resolve;
        let addrs: Vec<SocketAddr> = Refusing
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
        assert!(!addrs.is_empty());
    }
}
