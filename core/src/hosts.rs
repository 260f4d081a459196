//! Where webhooks may send requests: the URL rules and the address policy
//! against server-side request forgery (pure functions, unit-tested without
//! a server).
//!
//! Outbound HTTP from the database server can reach what the server can:
//! its own loopback services, the cloud metadata endpoint, the private
//! network behind it. So an address is allowed when it is public, or when
//! `litebase_streams.webhook_allowed_hosts` lists it (a host name, an IP
//! address or a CIDR range). The check runs on every address a host name
//! resolves to, at every connection, and the client connects only to the
//! addresses that passed it: a public name that resolves to a private
//! address is refused, and a name whose DNS answer changes between the
//! check and the connection cannot slip through.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// The longest URL a webhook may have.
pub const MAX_URL_BYTES: usize = 2048;

/// What `litebase_streams.webhook_allowed_hosts` lists besides public
/// addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    names: Vec<String>,
    nets: Vec<IpNet>,
}

impl Allowed {
    /// Parse the setting: comma-separated host names, IP addresses and CIDR
    /// ranges. An entry that is none of them is an error naming it.
    pub fn parse(setting: &str) -> Result<Allowed, String> {
        let mut allowed = Allowed::default();
        for entry in setting.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if let Ok(net) = entry.parse::<IpNet>() {
                allowed.nets.push(net.trunc());
            } else if let Ok(ip) = entry.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
                allowed.nets.push(IpNet::from(ip));
            } else if is_host_name(entry) {
                allowed.names.push(entry.trim_end_matches('.').to_ascii_lowercase());
            } else {
                return Err(format!(
                    "\"{}\" is neither a host name, an IP address nor a CIDR range",
                    entry.escape_default()
                ));
            }
        }
        Ok(allowed)
    }

    /// Whether a request to `host` (as written in the URL) may go to `ip`.
    pub fn permits(&self, host: &str, ip: IpAddr) -> bool {
        self.lists_name(host) || self.nets.iter().any(|net| net.contains(&ip)) || is_public(ip)
    }

    fn lists_name(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.names.iter().any(|name| name.eq_ignore_ascii_case(host))
    }
}

/// A webhook URL, checked: `http` or `https`, a host, no credentials, and
/// (when the host is an IP address or a name that is always local) an
/// address the policy allows. Names are resolved only by the worker, at
/// each connection: a user's backend does no network I/O.
pub fn check_url(raw: &str, allowed: &Allowed) -> Result<url::Url, String> {
    if raw.len() > MAX_URL_BYTES {
        return Err(format!("it is longer than {MAX_URL_BYTES} bytes"));
    }
    let url = url::Url::parse(raw).map_err(|e| format!("it is not a valid URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("its scheme is \"{}\"; a webhook URL is http or https", url.scheme()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("it carries credentials; put them in the path or query, or sign with the secret".into());
    }
    if url.fragment().is_some() {
        return Err("it has a fragment (#...), which HTTP never sends".into());
    }
    let host = url.host().ok_or("it has no host")?;
    let host_text = host.to_string();
    let literal = match host {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(name) if is_local_name(name) => Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        url::Host::Domain(_) => None,
    };
    if let Some(ip) = literal {
        if !allowed.permits(host_text.trim_start_matches('[').trim_end_matches(']'), ip) {
            return Err(format!(
                "its host {host_text} is a loopback, private, link-local or otherwise non-public address; \
                 a superuser can allow it in litebase_streams.webhook_allowed_hosts"
            ));
        }
    }
    Ok(url)
}

/// `localhost` and its subdomains always resolve to loopback (RFC 6761).
fn is_local_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

fn is_host_name(entry: &str) -> bool {
    let entry = entry.trim_end_matches('.');
    !entry.is_empty()
        && entry.len() <= 253
        && entry.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
        })
}

/// Whether `ip` is a public unicast address: not loopback, private,
/// link-local, shared (CGNAT), unspecified, broadcast, multicast,
/// reserved or documentation space, in IPv4 or IPv6 (IPv4-mapped,
/// -compatible and NAT64 addresses are judged by the IPv4 address they
/// carry).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (b & 0xc0) == 64) // shared address space (CGNAT), 100.64.0.0/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments, 192.0.0.0/24
        || (a == 198 && (b & 0xfe) == 18) // benchmarking, 198.18.0.0/15
        || a >= 240) // reserved, 240.0.0.0/4
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    let v4_in = |high: u16, low: u16| Ipv4Addr::new((high >> 8) as u8, high as u8, (low >> 8) as u8, low as u8);
    // Forms that carry an IPv4 address a gateway may forward to: NAT64
    // (64:ff9b::/96), the deprecated IPv4-compatible form (::/96), SIIT's
    // IPv4-translated form (::ffff:0:0/96) and 6to4 (2002::/16).
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
        || (s[..6] == [0; 6] && !ip.is_loopback())
        || s[..6] == [0, 0, 0, 0, 0xffff, 0]
    {
        return !ip.is_unspecified() && is_public_v4(v4_in(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return is_public_v4(v4_in(s[1], s[2]));
    }
    // Global unicast is 2000::/3; within it, IETF protocol assignments
    // (2001::/23: Teredo, benchmarking, ORCHID, ...) and documentation
    // (2001:db8::/32) are not public. Nothing outside 2000::/3 is (local
    // NAT64 64:ff9b:1::/48, discard 100::/64, unique and link local,
    // multicast, ...).
    (s[0] & 0xe000) == 0x2000 && !(s[0] == 0x2001 && s[1] < 0x0200) && !(s[0] == 0x2001 && s[1] == 0x0db8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn non_public_addresses_are_refused_by_default() {
        let none = Allowed::default();
        for refused in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
            "2002:a9fe:a9fe::",
            "2001::1",
            "2001:10::1",
            "64:ff9b:1::7f00:1",
            "::ffff:0:7f00:1",
            "100::",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(!none.permits("example.com", ip(refused)), "{refused} must be refused");
        }
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:2800:220:1:248:1893:25c8:1946",
            "::ffff:8.8.8.8",
            "2002:808:808::1",
            "2001:4860:4860::8888",
        ] {
            assert!(none.permits("example.com", ip(public)), "{public} is public");
        }
    }

    #[test]
    fn the_setting_allows_names_addresses_and_ranges() {
        let allowed = Allowed::parse(" 127.0.0.1, 10.1.0.0/16 ,hooks.internal., [::1]").unwrap();
        assert!(allowed.permits("x", ip("127.0.0.1")));
        assert!(!allowed.permits("x", ip("127.0.0.2")));
        assert!(allowed.permits("x", ip("10.1.200.3")));
        assert!(!allowed.permits("x", ip("10.2.0.1")));
        assert!(allowed.permits("x", ip("::1")));
        assert!(allowed.permits("HOOKS.internal", ip("192.168.0.9")));
        assert!(!allowed.permits("other.internal", ip("192.168.0.9")));
        assert_eq!(Allowed::parse(""), Ok(Allowed::default()));
        assert!(Allowed::parse("10.0.0.0/33").is_err());
        assert!(Allowed::parse("a b").is_err());
    }

    #[test]
    fn urls_are_checked_before_anything_is_stored() {
        let none = Allowed::default();
        assert!(check_url("https://example.com/hook?x=1", &none).is_ok());
        assert!(check_url("http://example.com:8080/", &none).is_ok());
        for (bad, why) in [
            ("ftp://example.com/", "scheme"),
            ("file:///etc/passwd", "scheme"),
            ("not a url", "not a valid URL"),
            ("https://user:pw@example.com/", "credentials"),
            ("http://127.0.0.1:8080/", "loopback"),
            ("http://[::1]/", "loopback"),
            ("http://169.254.169.254/latest/meta-data", "loopback"),
            ("http://localhost/", "loopback"),
            ("http://api.localhost./", "loopback"),
            ("http://0x7f.1/", "loopback"),
            ("https://example.com/#frag", "fragment"),
        ] {
            let error = check_url(bad, &none).expect_err(bad);
            assert!(error.contains(why), "{bad}: {error}");
        }
        let local = Allowed::parse("127.0.0.1,localhost").unwrap();
        assert!(check_url("http://127.0.0.1:8080/", &local).is_ok());
        assert!(check_url("http://localhost:8080/", &local).is_ok());
        assert!(check_url(&format!("https://example.com/{}", "a".repeat(MAX_URL_BYTES)), &none).is_err());
    }
}
