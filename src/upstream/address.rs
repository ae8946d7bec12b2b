//! Where no request of kbind's goes: link-local and cloud metadata addresses. A provider's
//! apiserver, a directory or SpiceDB is never there, and an answer read back from one would
//! carry the machine's own credentials into a status (docs/hostile-inputs.md).
//!
//! IP literals are refused where a destination is parsed (the kubeconfig check, relsync's
//! allowedHosts); names are refused by [`Refusing`], the resolver of every upstream client, so
//! the address checked is the address connected to (no window for a DNS answer that changes
//! between the check and the connection).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Link-local (169.254.0.0/16, fe80::/10) and the cloud metadata addresses outside them, also
/// when an IPv6 address carries one of the IPv4 ones (IPv4-mapped `::ffff:a.b.c.d`,
/// IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`).
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_link_local() // 169.254.0.0/16: AWS, GCP, Azure, OpenStack metadata
                || v4 == Ipv4Addr::new(100, 100, 100, 200) // Alibaba Cloud metadata
                || v4 == Ipv4Addr::new(168, 63, 129, 16) // Azure WireServer
        }
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => is_forbidden(IpAddr::V4(v4)),
            None => {
                (v6.segments()[0] & 0xffc0) == 0xfe80 // fe80::/10 link-local
                    || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) // AWS IPv6 metadata
            }
        },
    }
}

/// The IPv4 address an IPv6 one carries: IPv4-mapped, IPv4-compatible (deprecated, but routed
/// as IPv4 by some stacks) or the NAT64 well-known prefix `64:ff9b::/96`.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let low = Ipv4Addr::new(
        (s[6] >> 8) as u8,
        (s[6] & 0xff) as u8,
        (s[7] >> 8) as u8,
        (s[7] & 0xff) as u8,
    );
    let compatible = s[..6].iter().all(|&x| x == 0) && (s[6] != 0 || s[7] > 1); // not :: or ::1
    let nat64 = s[0] == 0x64 && s[1] == 0xff9b && s[2..6].iter().all(|&x| x == 0);
    (compatible || nat64).then_some(low)
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
            ("168.63.129.16", true),
            ("::169.254.169.254", true),
            ("64:ff9b::169.254.169.254", true),
            ("64:ff9b::a9fe:a9fe", true),
            ("::ffff:168.63.129.16", true),
            ("64:ff9b::10.0.0.1", false),
            ("::", false),
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
