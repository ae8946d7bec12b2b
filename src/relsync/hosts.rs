//! Which destinations a credential may be sent to (docs/relsync.md "Credentials and
//! allowedHosts").
//!
//! `spec.baseURL` is tenant-writable and the credential is read with the job's own cluster-wide
//! rights, so an unchecked pairing would let anyone who can write a RelationshipSource send
//! any Secret to any host. A baseURL is admitted only when one of the credential's entries
//! names its host exactly. A kind with a fixed, operator-set endpoint (Slack's
//! `--slack-api-url`) is checked the same way whenever the credential lists allowedHosts: a
//! credential that has a list is sent only to hosts on it, whatever the kind; an empty list is
//! checked against nothing (docs/contract.md "relsync"). Entries:
//! - `host` admits that host on the scheme's default port (80 for http, 443 for https);
//! - `host:port` admits that host on that port;
//! - `*.domain` (optionally `:port`) admits strict subdomains of `domain`, never `domain` itself
//!   and never an IP address;
//! - an IP address is admitted only by an entry that is the same IP literal (`127.0.0.1:8080`,
//!   `[::1]:8080`), compared as addresses so `127.1` or `0x7f.0.0.1` cannot sneak past.
//!
//! Comparison is case-insensitive; a trailing dot on a name is ignored. A link-local or cloud
//! metadata address is refused whatever the list says (`crate::upstream::address`; a name
//! resolving to one is refused when the client resolves it).

use std::net::IpAddr;

use reqwest::Url;

/// Why a baseURL was not admitted, phrased for the Ready condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("baseURL is not a valid URL: {0}")]
    Invalid(#[source] url::ParseError),
    #[error("baseURL scheme {0:?} is not http or https")]
    Scheme(String),
    #[error("baseURL must not carry user info, a query or a fragment")]
    Extras,
    #[error(
        "credential {credential:?} declares no allowedHosts, so it may not be sent to baseURL host {host}"
    )]
    NoAllowlist { credential: String, host: String },
    #[error("baseURL host {host} is not in credential {credential:?} allowedHosts")]
    NotAllowed { credential: String, host: String },
    /// The kind's own endpoint (not the baseURL) is not on the credential's list.
    #[error(
        "{endpoint} host {host} is not in credential {credential:?} allowedHosts, so the credential is not sent there"
    )]
    EndpointNotAllowed {
        credential: String,
        host: String,
        endpoint: &'static str,
    },
    /// A link-local or cloud metadata address (`crate::upstream::address`), whatever
    /// allowedHosts lists.
    #[error("host {host} is a link-local or cloud metadata address; refused")]
    Forbidden { host: String },
    /// The kind's own endpoint (operator configuration) is not a usable destination.
    #[error("{endpoint} is not a usable URL: {source}")]
    BadEndpoint {
        endpoint: &'static str,
        #[source]
        source: Box<HostError>,
    },
}

/// A parsed destination: lower-cased host (IPv6 without brackets) and effective port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub url: Url,
    pub host: String,
    pub port: u16,
}

impl Destination {
    /// `host:port` as shown in conditions.
    pub fn display(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Parse and sanity-check a baseURL.
pub fn parse_base_url(raw: &str) -> Result<Destination, HostError> {
    let url = Url::parse(raw.trim()).map_err(HostError::Invalid)?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(HostError::Scheme(url.scheme().to_string()));
    }
    if !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(HostError::Extras);
    }
    let raw_host = url
        .host_str()
        .ok_or(HostError::Invalid(url::ParseError::EmptyHost))?;
    let bare = raw_host.trim_start_matches('[').trim_end_matches(']');
    let host = match bare.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => normalize_name(bare),
    };
    let port = url
        .port_or_known_default()
        .ok_or(HostError::Invalid(url::ParseError::InvalidPort))?;
    let dest = Destination { url, host, port };
    match dest.host.parse::<IpAddr>() {
        Ok(ip) if crate::upstream::address::is_forbidden(ip) => Err(HostError::Forbidden {
            host: dest.display(),
        }),
        _ => Ok(dest),
    }
}

fn normalize_name(s: &str) -> String {
    s.trim_end_matches('.').to_ascii_lowercase()
}

/// Split an allowedHosts entry into (host, optional port).
fn split_entry(entry: &str) -> Option<(String, Option<u16>)> {
    let e = entry.trim();
    if let Some(rest) = e.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((ip.to_ascii_lowercase(), port));
    }
    match e.rsplit_once(':') {
        // More than one colon and no brackets: a bare IPv6 literal without a port.
        Some((h, _)) if h.contains(':') => Some((e.to_ascii_lowercase(), None)),
        Some((h, p)) => Some((normalize_name(h), Some(p.parse().ok()?))),
        None => Some((normalize_name(e), None)),
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

/// Whether one entry admits the destination.
pub fn entry_admits(entry: &str, dest: &Destination) -> bool {
    let Some((host, port)) = split_entry(entry) else {
        return false;
    };
    let want_port = port.unwrap_or_else(|| default_port(dest.url.scheme()));
    if want_port != dest.port {
        return false;
    }
    let dest_ip = dest.host.parse::<IpAddr>().ok();
    if let Some(domain) = host.strip_prefix("*.") {
        return dest_ip.is_none()
            && !domain.is_empty()
            && dest.host.len() > domain.len() + 1
            && dest.host.ends_with(&format!(".{domain}"));
    }
    match (dest_ip, host.parse::<IpAddr>().ok()) {
        (Some(d), Some(e)) => d == e,
        (None, None) => dest.host == host,
        _ => false,
    }
}

/// Admit `base_url` for `credential` with its `allowed` entries, or say why not.
pub fn admit(
    base_url: &str,
    credential: &str,
    allowed: &[String],
) -> Result<Destination, HostError> {
    let dest = parse_base_url(base_url)?;
    if allowed.is_empty() {
        return Err(HostError::NoAllowlist {
            credential: credential.to_string(),
            host: dest.display(),
        });
    }
    if allowed.iter().any(|e| entry_admits(e, &dest)) {
        Ok(dest)
    } else {
        Err(HostError::NotAllowed {
            credential: credential.to_string(),
            host: dest.display(),
        })
    }
}

/// Admit a kind's own endpoint `url` (named `endpoint` in messages, e.g. "the Slack API URL
/// (--slack-api-url)") for `credential`: a credential without allowedHosts is checked against
/// nothing; one with a list is sent only to a host on it.
pub fn admit_endpoint(
    url: &str,
    endpoint: &'static str,
    credential: &str,
    allowed: &[String],
) -> Result<(), HostError> {
    if let Err(e @ HostError::Forbidden { .. }) = parse_base_url(url) {
        return Err(HostError::BadEndpoint {
            endpoint,
            source: Box::new(e),
        });
    }
    if allowed.is_empty() {
        return Ok(());
    }
    let dest = parse_base_url(url).map_err(|e| HostError::BadEndpoint {
        endpoint,
        source: Box::new(e),
    })?;
    if allowed.iter().any(|e| entry_admits(e, &dest)) {
        Ok(())
    } else {
        Err(HostError::EndpointNotAllowed {
            credential: credential.to_string(),
            host: dest.display(),
            endpoint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admits(entry: &str, url: &str) -> bool {
        entry_admits(entry, &parse_base_url(url).unwrap())
    }

    #[test]
    fn matching_table() {
        let cases = [
            // (entry, url, admitted)
            ("scim.example.com", "https://scim.example.com", true),
            ("SCIM.Example.com", "https://scim.example.COM/scim", true),
            ("scim.example.com", "https://scim.example.com.", true),
            ("scim.example.com", "https://scim.example.com:8443", false),
            (
                "scim.example.com:8443",
                "https://scim.example.com:8443",
                true,
            ),
            ("scim.example.com:443", "https://scim.example.com", true),
            ("scim.example.com", "http://scim.example.com", true),
            ("scim.example.com", "https://evil-scim.example.com", false),
            (
                "scim.example.com",
                "https://scim.example.com.evil.io",
                false,
            ),
            ("*.example.com", "https://scim.example.com", true),
            ("*.example.com", "https://a.b.example.com", true),
            ("*.example.com", "https://example.com", false),
            ("*.example.com", "https://badexample.com", false),
            ("*.example.com:8080", "http://scim.example.com:8080", true),
            ("*.example.com", "http://scim.example.com:8080", false),
            ("127.0.0.1:8080", "http://127.0.0.1:8080", true),
            ("127.0.0.1", "http://127.0.0.1:8080", false),
            ("127.0.0.1:8080", "http://127.1:8080", true),
            ("localhost:8080", "http://127.0.0.1:8080", false),
            ("127.0.0.1:8080", "http://localhost:8080", false),
            ("*.0.0.1", "http://127.0.0.1", false),
            ("[::1]:8080", "http://[::1]:8080", true),
            ("::1", "http://[::1]", true),
            ("[::1]:8080", "http://[::1]:9090", false),
            (
                "scim.example.com:notaport",
                "https://scim.example.com",
                false,
            ),
        ];
        for (entry, url, want) in cases {
            assert_eq!(admits(entry, url), want, "{entry} vs {url}");
        }
    }

    #[test]
    fn admit_says_why() {
        let allowed = vec!["scim.example.com".to_string()];
        assert!(admit("https://scim.example.com", "c", &allowed).is_ok());
        assert!(matches!(
            admit("http://127.0.0.1:9", "c", &allowed),
            Err(HostError::NotAllowed { host, .. }) if host == "127.0.0.1:9"
        ));
        assert!(matches!(
            admit("https://scim.example.com", "c", &[]),
            Err(HostError::NoAllowlist { .. })
        ));
        assert_eq!(
            admit("ftp://scim.example.com", "c", &allowed),
            Err(HostError::Scheme("ftp".into()))
        );
        assert_eq!(
            admit("https://u:p@scim.example.com", "c", &allowed),
            Err(HostError::Extras)
        );
        assert_eq!(
            admit("https://scim.example.com/?x=1", "c", &allowed),
            Err(HostError::Extras)
        );
        assert!(matches!(
            admit("not a url", "c", &allowed),
            Err(HostError::Invalid(_))
        ));
    }

    /// A link-local or metadata address is refused even when the credential lists it, in
    /// every spelling, as a baseURL and as a kind's own endpoint (with or without a list).
    #[test]
    fn metadata_addresses_are_refused_whatever_the_list_says() {
        let listed: Vec<String> = [
            "169.254.169.254",
            "169.254.169.254:8080",
            "[fe80::1]:8080",
            "100.100.100.200",
            "[::ffff:a9fe:a9fe]",
        ]
        .map(String::from)
        .to_vec();
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.169.254:8080/",
            "http://2852039166/",
            "http://[fe80::1]:8080/",
            "http://100.100.100.200/",
            "http://[::ffff:169.254.169.254]/",
        ] {
            let e = admit(url, "c", &listed).unwrap_err();
            assert!(matches!(e, HostError::Forbidden { .. }), "{url}: {e:?}");
            assert!(
                e.to_string().contains("link-local or cloud metadata"),
                "{e}"
            );
            for allowed in [&listed[..], &[]] {
                assert!(
                    matches!(
                        admit_endpoint(url, "the Slack API URL (--slack-api-url)", "c", allowed),
                        Err(HostError::BadEndpoint { .. })
                    ),
                    "{url}"
                );
            }
        }
        assert!(matches!(
            admit("http://169.254.169.254/", "c", &listed),
            Err(HostError::Forbidden { host }) if host == "169.254.169.254:80"
        ));
    }

    #[test]
    fn a_fixed_endpoint_is_checked_only_against_a_list() {
        const SLACK: &str = "the Slack API URL (--slack-api-url)";
        // No list: checked against nothing (docs/contract.md "relsync"), even an unparsable URL.
        assert_eq!(
            admit_endpoint("https://slack.com/api", SLACK, "c", &[]),
            Ok(())
        );
        let scim_only = vec!["scim.example.com".to_string()];
        let e = admit_endpoint("https://slack.com/api", SLACK, "c", &scim_only).unwrap_err();
        assert_eq!(
            e,
            HostError::EndpointNotAllowed {
                credential: "c".into(),
                host: "slack.com:443".into(),
                endpoint: SLACK,
            }
        );
        assert!(e.to_string().contains("slack.com:443"), "{e}");
        assert!(e.to_string().contains("\"c\""), "{e}");
        let slack = vec!["slack.com".to_string(), "scim.example.com".to_string()];
        assert_eq!(
            admit_endpoint("https://slack.com/api", SLACK, "c", &slack),
            Ok(())
        );
        assert!(matches!(
            admit_endpoint("not a url", SLACK, "c", &slack),
            Err(HostError::BadEndpoint { .. })
        ));
    }
}
