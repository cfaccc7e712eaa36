//! Settings values that are parsed while the file is read, so the code that
//! uses them gets the type, never the text: proxy ranges and mailboxes. A bad
//! value fails the load naming its key and list index
//! (`email.admin_alerts_to[1]`), like any other malformed setting.

use std::fmt::Display;
use std::str::FromStr;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Written as the text it was read from (`Display`).
fn write<T: Display, S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

fn read<'de, T, D>(
    deserializer: D,
    parse: impl Fn(&str) -> Option<T>,
    what: &str,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    let text = String::deserialize(deserializer)?;
    parse(&text).ok_or_else(|| D::Error::custom(format!("{text:?} is not {what}")))
}

/// A list element read by `read`, so the list's error path carries its index.
struct Element<T>(T);

/// `lists.allow_ips` and `lists.block_ips`: CIDRs, a bare address meaning
/// /32 or /128; what a list entry may be is checked with the lists'
/// validation, which names its own rules.
pub mod cidrs {
    use ipnet::IpNet;

    use super::*;
    use crate::domain::client_ip::parse_cidr;

    impl<'de> Deserialize<'de> for Element<IpNet> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            read(deserializer, parse_cidr, "a CIDR or IP address").map(Element)
        }
    }

    /// Reads a list of CIDRs or addresses.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
        let elements = Vec::<Element<IpNet>>::deserialize(deserializer)?;
        Ok(elements.into_iter().map(|e| e.0).collect())
    }

    /// Writes each range as `address/prefix`.
    pub fn serialize<S: Serializer>(nets: &[IpNet], serializer: S) -> Result<S::Ok, S::Error> {
        let texts: Vec<String> = nets.iter().map(ToString::to_string).collect();
        texts.serialize(serializer)
    }
}

/// `server.trusted_proxies`: CIDRs, a bare address meaning /32 or /128,
/// read as list entries are (`domain::ip_range`): a range of every address
/// or one with host bits set (`203.0.113.7/2`, a typo for a quarter of the
/// IPv4 internet) would let any client behind it name its own address.
pub mod proxy_cidrs {
    use ipnet::IpNet;

    use super::*;
    use crate::domain::ip_range::{checked_range, RangeRefusal};

    impl<'de> Deserialize<'de> for ProxyRange {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let text = String::deserialize(deserializer)?;
            checked_range(&text)
                .map(ProxyRange)
                .map_err(|why| D::Error::custom(refused(&text, why)))
        }
    }

    /// Why `text` is no trusted proxy range.
    fn refused(text: &str, why: RangeRefusal) -> String {
        match why {
            RangeRefusal::NotARange => format!("{text:?} is not a CIDR or IP address"),
            RangeRefusal::HoldsTranslationPrefix => format!(
                "{text:?} holds 64:ff9b::/96, where a NAT64 translator writes every IPv4 \
                 client: list the proxy's own address or range"
            ),
            RangeRefusal::MappedPrefix => format!(
                "{text:?} is ::ffff:0:0/96, every IPv4 address: list the proxy's own \
                 address or range"
            ),
            RangeRefusal::EveryAddress { v4 } => format!(
                "{text:?} is every {} address: any client could name its own address; \
                 list the proxies' ranges, or set trusted_proxy_hops when only the load \
                 balancer can reach tollgate",
                if v4 { "IPv4" } else { "IPv6" }
            ),
            RangeRefusal::HostBits {
                prefix_len,
                network,
            } => format!(
                "{text:?} has bits set right of its /{prefix_len} mask: write {network} \
                 for the range it names, or the address alone"
            ),
        }
    }

    /// One proxy range, read by its own rules.
    struct ProxyRange(IpNet);

    /// Reads a list of CIDRs or addresses.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
        let elements = Vec::<ProxyRange>::deserialize(deserializer)?;
        Ok(elements.into_iter().map(|e| e.0).collect())
    }

    /// Writes each range as `address/prefix`.
    pub fn serialize<S: Serializer>(nets: &[IpNet], serializer: S) -> Result<S::Ok, S::Error> {
        let texts: Vec<String> = nets.iter().map(ToString::to_string).collect();
        texts.serialize(serializer)
    }
}

/// `email.from`: one mailbox, as lettre reads it (`Name <a@b.c>` or `a@b.c`).
pub mod mailbox {
    use lettre::message::Mailbox;

    use super::*;

    /// Reads a mailbox.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Mailbox, D::Error> {
        read(
            deserializer,
            |t| Mailbox::from_str(t).ok(),
            "an email address",
        )
    }

    /// Writes the mailbox as lettre prints it.
    pub fn serialize<S: Serializer>(mailbox: &Mailbox, serializer: S) -> Result<S::Ok, S::Error> {
        write(mailbox, serializer)
    }
}

/// `server.client_ip_header`: a header name, written back lower case.
pub mod client_ip_header {
    use super::*;
    use crate::domain::forwarding::ClientIpHeader;

    /// Reads a header name.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<ClientIpHeader, D::Error> {
        read(
            deserializer,
            ClientIpHeader::parse,
            "a valid HTTP header name that a proxy sets to the client's address (not one \
             that never holds one, such as host, authorization or cookie)",
        )
    }

    /// Writes the name, lower case.
    pub fn serialize<S: Serializer>(
        header: &ClientIpHeader,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        write(header, serializer)
    }
}

/// `email.admin_alerts_to`: a list of mailboxes.
pub mod mailboxes {
    use lettre::message::Mailbox;

    use super::*;

    impl<'de> Deserialize<'de> for Element<Mailbox> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            super::mailbox::deserialize(deserializer).map(Element)
        }
    }

    /// Reads a list of mailboxes.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Mailbox>, D::Error> {
        let elements = Vec::<Element<Mailbox>>::deserialize(deserializer)?;
        Ok(elements.into_iter().map(|e| e.0).collect())
    }

    /// Writes each mailbox as lettre prints it.
    pub fn serialize<S: Serializer>(
        mailboxes: &[Mailbox],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let texts: Vec<String> = mailboxes.iter().map(ToString::to_string).collect();
        texts.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use ipnet::IpNet;
    use lettre::message::Mailbox;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Holder {
        #[serde(with = "super::cidrs")]
        nets: Vec<IpNet>,
        #[serde(with = "super::mailbox")]
        from: Mailbox,
        #[serde(with = "super::mailboxes")]
        to: Vec<Mailbox>,
    }

    #[test]
    fn values_read_back_as_written() {
        let text = "nets = [\"10.0.0.0/8\", \"::1\"]\nfrom = \"Ops <ops@example.com>\"\nto = [\"a@example.com\"]\n";
        let holder: Holder = toml::from_str(text).unwrap();
        assert_eq!(holder.nets[1].to_string(), "::1/128");
        assert_eq!(holder.from.email.to_string(), "ops@example.com");
        let again: Holder = toml::from_str(&toml::to_string(&holder).unwrap()).unwrap();
        assert_eq!(again, holder);
    }

    #[test]
    fn a_bad_element_is_refused_with_its_text() {
        let bad = "nets = [\"10.0.0.0/8\", \"10.0.0.0/33\"]\nfrom = \"a@example.com\"\nto = []\n";
        let error = toml::from_str::<Holder>(bad).unwrap_err().to_string();
        assert!(
            error.contains("\"10.0.0.0/33\" is not a CIDR or IP address"),
            "{error}"
        );
        let bad = "nets = []\nfrom = \"a@example.com\"\nto = [\"nobody\"]\n";
        let error = toml::from_str::<Holder>(bad).unwrap_err().to_string();
        assert!(
            error.contains("\"nobody\" is not an email address"),
            "{error}"
        );
    }
}
