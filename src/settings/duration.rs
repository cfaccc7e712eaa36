//! Durations as the configuration writes them: read by humantime (`"500ms"`,
//! `"90d"`, `"1h 30m"`), written in the largest unit that divides them exactly
//! (`"90d"`, not humantime's `"2months 29days 2h 52m 48s"`), so that
//! `check-config` prints what a file would say.

use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

/// The longest duration any setting takes: a century (`"36500d"`). A longer
/// one is a slip, and far enough out (a few hundred thousand years) it no
/// longer fits the clocks and stores it is added to: it wrapped, or a lock
/// became a 503 from Redis and a panic in the admin page.
pub const LONGEST: Duration = Duration::from_secs(36_500 * 86_400);

/// Reads humantime text: `"500ms"`, `"90d"`, `"1h 30m"`; at most [`LONGEST`].
/// humantime's `M` is a month: `"1M"` for a minute would be 43,830 of them
/// (a phone's one send a month, a code valid for half a year), so it is
/// refused, and months are written as days.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    use serde::de::IntoDeserializer;
    let text = String::deserialize(deserializer)?;
    if text
        .split(|c: char| !c.is_ascii_alphabetic())
        .any(|unit| unit == "M")
    {
        return Err(D::Error::custom(
            "`M` is a month: write minutes as `m`, and months as days (`30d`)",
        ));
    }
    let value: Duration = humantime_serde::deserialize(text.into_deserializer())
        .map_err(|e: serde::de::value::Error| D::Error::custom(e))?;
    if value > LONGEST {
        return Err(D::Error::custom("must be at most 36500d (a century)"));
    }
    Ok(value)
}

use crate::domain::rule::format_window;

/// Writes the duration in the largest exact unit (`"90d"`, `"100ms"`);
/// humantime's form when it has sub-millisecond parts.
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        // Finer than a millisecond: no unit of the configuration's says it.
        return humantime_serde::serialize(duration, serializer);
    }
    match u64::try_from(duration.as_millis()) {
        Ok(ms) => serializer.serialize_str(&format_window(ms)),
        Err(_) => humantime_serde::serialize(duration, serializer),
    }
}

/// Refuses a duration under a millisecond, which every timeout and window
/// setting would treat as "never" or "always".
pub(super) fn at_least_a_millisecond(
    key: &str,
    value: Duration,
) -> Result<(), super::SettingsError> {
    if value.as_millis() == 0 {
        return Err(super::SettingsError::invalid(key, "must be at least 1ms"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Holder {
        #[serde(with = "super")]
        d: Duration,
    }

    proptest::proptest! {
        /// Any whole number of milliseconds prints as the configuration writes
        /// it and reads back as itself.
        #[test]
        fn any_duration_reads_back(ms in 0u64..=400 * 86_400_000) {
            let d = Duration::from_millis(ms);
            let text = toml::to_string(&Holder { d }).unwrap();
            proptest::prop_assert_eq!(toml::from_str::<Holder>(&text).unwrap().d, d, "{}", text);
        }
    }

    #[test]
    fn a_duration_over_a_century_is_refused() {
        let century = toml::from_str::<Holder>(r#"d = "36500d""#).map(|h| h.d);
        assert_eq!(century.ok(), Some(super::LONGEST));
        for text in [
            r#"d = "36501d""#,
            r#"d = "100000000d""#,
            r#"d = "99999999999999d""#,
        ] {
            let err = toml::from_str::<Holder>(text).expect_err(text).to_string();
            assert!(err.contains("at most 36500d"), "{text}: {err}");
        }
    }

    #[test]
    fn a_month_written_m_is_refused_and_minutes_read_as_ever() {
        for text in [
            r#"d = "1M""#,
            r#"d = "5M""#,
            r#"d = "1h 1M""#,
            r#"d = "2M3d""#,
        ] {
            let err = toml::from_str::<Holder>(text).expect_err(text).to_string();
            assert!(err.contains("`M` is a month"), "{text}: {err}");
        }
        for (text, duration) in [
            (r#"d = "1m""#, Duration::from_secs(60)),
            (r#"d = "5ms""#, Duration::from_millis(5)),
            (r#"d = "1min""#, Duration::from_secs(60)),
            (r#"d = "1h 30m""#, Duration::from_secs(5400)),
        ] {
            assert_eq!(
                toml::from_str::<Holder>(text).unwrap().d,
                duration,
                "{text}"
            );
        }
        let err = toml::from_str::<Holder>(r#"d = "soon""#).expect_err("no duration");
        assert!(err.to_string().contains("soon"), "{err}");
    }

    #[test]
    fn durations_print_in_the_largest_exact_unit_and_read_back() {
        for (duration, written) in [
            (Duration::from_secs(90 * 86_400), "90d"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(5400), "90m"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(3600), "1h"),
        ] {
            let text = toml::to_string(&Holder { d: duration }).unwrap();
            assert_eq!(text.trim(), format!("d = \"{written}\""));
            assert_eq!(toml::from_str::<Holder>(&text).unwrap().d, duration);
        }
    }
}
