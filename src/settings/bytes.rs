//! Sizes in bytes as the configuration writes them: a whole number with an
//! optional unit, `"256MiB"`, `"512 KB"`, `"1GiB"`, or a bare number of bytes
//! (`1048576`, or `"1048576"` from an environment variable). `KB`, `MB`,
//! `GB` are powers of 1000, `KiB`, `MiB`, `GiB` of 1024. Written back in the
//! largest binary unit that divides the size exactly, so `check-config`
//! prints what a file would say.

use serde::de::{self, Deserializer, Visitor};
use serde::Serializer;

const UNITS: [(&str, u64); 7] = [
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("B", 1),
];

/// The bytes `text` names, or why it names none.
pub fn parse(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let unit = unit.trim();
    let bad = || {
        format!("{text:?} is not a size: write a whole number and a unit such as \"256MiB\" (B, KB, MB, GB, KiB, MiB, GiB)")
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let scale = match unit {
        "" => 1,
        unit => UNITS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(unit))
            .map(|(_, scale)| *scale)
            .ok_or_else(bad)?,
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `bytes` in the largest binary unit that divides it (`"256MiB"`).
pub fn format(bytes: u64) -> String {
    for (name, scale) in UNITS.iter().filter(|(name, _)| name.contains('i')) {
        if bytes != 0 && bytes.is_multiple_of(*scale) {
            return format!("{}{name}", bytes / scale);
        }
    }
    format!("{bytes}B")
}

pub fn serialize<S: Serializer>(bytes: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*bytes))
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Size;
    impl Visitor<'_> for Size {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a size such as \"256MiB\", or a number of bytes")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom("a size cannot be negative"))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse(v).map_err(E::custom)
        }
    }
    deserializer.deserialize_any(Size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_with_units_and_print_back() {
        for (text, bytes) in [
            ("256MiB", 256 << 20),
            ("1 GiB", 1 << 30),
            ("512kib", 512 << 10),
            ("2MB", 2_000_000),
            ("1048576", 1 << 20),
            ("100B", 100),
        ] {
            assert_eq!(parse(text), Ok(bytes), "{text}");
        }
        assert_eq!(format(256 << 20), "256MiB");
        assert_eq!(format(2_000_000), "2000000B");
        assert_eq!(format(1536), "1536B");
        assert_eq!(format(3 << 10), "3KiB");
    }

    #[test]
    fn anything_else_is_refused_with_the_units_named() {
        for text in [
            "",
            "MiB",
            "1.5GiB",
            "-1MiB",
            "12 parsecs",
            "99999999999999GiB",
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(text.trim()), "{text}: {err}");
        }
        assert!(parse("1TB").unwrap_err().contains("MiB"));
    }
}
