//! Durations as people write them on a command line or in a config file: `500ms`, `10s`,
//! `2m`, `1h`, or a bare number of seconds (`2.5`, as `flock -w` takes it).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use thiserror::Error;

/// A [`Duration`] parsed from text such as `500ms`, `10s`, `2m`, `1h` or `2.5` (seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HumanDuration(pub(crate) Duration);

/// Text that is not a duration.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("`{0}` is not a duration: write a number with ms, s, m or h (a bare number is seconds)")]
pub(crate) struct DurationError(String);

impl FromStr for HumanDuration {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || DurationError(text.to_owned());
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let seconds_per_unit = match unit.trim() {
            "ms" => 0.001,
            "" | "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        Duration::try_from_secs_f64(value * seconds_per_unit)
            .map(HumanDuration)
            .map_err(|_| bad())
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Option<Duration> {
        text.parse::<HumanDuration>().ok().map(|d| d.0)
    }

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("2.5"), Some(Duration::from_millis(2500)));
        assert_eq!(parse("0"), Some(Duration::ZERO));
    }

    #[test]
    fn nonsense_is_refused() {
        for text in ["", "s", "10x", "-1s", "1e400", "ten"] {
            assert_eq!(parse(text), None, "{text}");
        }
    }
}
