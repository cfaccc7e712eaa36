//! A fraction between 0 and 1 (`sms.pumping.min_conversion`), read as a
//! number (`0.2`) or a percentage (`"20%"`), since people write conversion
//! rates both ways. Anything outside 0..=1 fails the load naming the key.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A fraction in `0.0..=1.0`, written back as a number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fraction(f64);

/// What a bad value is told.
const EXPECTED: &str = "a fraction between 0 and 1 (0.2) or a percentage (\"20%\")";

impl Fraction {
    /// `value` when it lies in `0.0..=1.0` (NaN does not).
    pub fn new(value: f64) -> Option<Self> {
        (0.0..=1.0).contains(&value).then_some(Self(value))
    }

    /// The fraction as a number.
    pub fn get(self) -> f64 {
        self.0
    }

    /// Parts per million, rounded: what the stores compare in integers, so
    /// that a conversion exactly at the threshold is never judged below it
    /// by a rounding error (`0.2` is 200000).
    pub fn ppm(self) -> u32 {
        (self.0 * 1_000_000.0).round() as u32
    }

    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        match text.strip_suffix('%') {
            Some(percent) => Self::new(percent.trim().parse::<f64>().ok()? / 100.0),
            None => Self::new(text.parse().ok()?),
        }
    }
}

impl fmt::Display for Fraction {
    /// As a percentage with at most one decimal (`20%`, `12.5%`), for rule
    /// names and pages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&percent(self.0))
    }
}

/// `ratio` as a percentage with at most one decimal: `0.15` → `15%`,
/// `1/3` → `33.3%`.
pub fn percent(ratio: f64) -> String {
    let tenths = (ratio * 1000.0).round() / 10.0;
    if tenths.fract() == 0.0 {
        format!("{tenths:.0}%")
    } else {
        format!("{tenths:.1}%")
    }
}

impl Serialize for Fraction {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.0)
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FractionVisitor;

        impl Visitor<'_> for FractionVisitor {
            type Value = Fraction;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Fraction, E> {
                Fraction::new(v).ok_or_else(|| E::custom(format!("{v} is not {EXPECTED}")))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Fraction, E> {
                self.visit_f64(v as f64)
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Fraction, E> {
                self.visit_f64(v as f64)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Fraction, E> {
                Fraction::parse(v).ok_or_else(|| E::custom(format!("{v:?} is not {EXPECTED}")))
            }
        }

        deserializer.deserialize_any(FractionVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Serialize)]
    struct Holder {
        f: Fraction,
    }

    fn read(value: &str) -> Result<f64, String> {
        toml::from_str::<Holder>(&format!("f = {value}"))
            .map(|h| h.f.get())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn numbers_and_percentages_read_the_same() {
        for (written, value) in [
            ("0.2", 0.2),
            ("\"20%\"", 0.2),
            ("\"12.5 %\"", 0.125),
            ("0", 0.0),
            ("1", 1.0),
            ("\"100%\"", 1.0),
            ("\"0.35\"", 0.35),
        ] {
            assert_eq!(read(written), Ok(value), "{written}");
        }
    }

    #[test]
    fn values_outside_zero_to_one_are_refused() {
        for written in [
            "1.5",
            "-0.1",
            "\"120%\"",
            "\"-5%\"",
            "\"a lot\"",
            "nan",
            "20",
        ] {
            let error = read(written).expect_err(written);
            assert!(error.contains("between 0 and 1"), "{written}: {error}");
        }
    }

    #[test]
    fn the_threshold_is_compared_in_whole_parts_per_million() {
        assert_eq!(Fraction::new(0.2).map(Fraction::ppm), Some(200_000));
        assert_eq!(
            Fraction::parse("33.3333%").map(Fraction::ppm),
            Some(333_333)
        );
        assert_eq!(Fraction::new(1.0).map(Fraction::ppm), Some(1_000_000));
    }

    #[test]
    fn percentages_print_with_at_most_one_decimal() {
        assert_eq!(percent(0.2), "20%");
        assert_eq!(percent(0.125), "12.5%");
        assert_eq!(percent(1.0 / 3.0), "33.3%");
        assert_eq!(percent(0.0), "0%");
        let printed = toml::to_string(&Holder { f: Fraction(0.2) }).unwrap();
        assert_eq!(printed.trim(), "f = 0.2");
    }
}
