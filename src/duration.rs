//! Duration values on the command line: `10`, `0.25`, `500ms`, `1h30m` (README: "Usage").

use std::time::Duration;

/// Units from the largest: in a combination each appears at most once, in this order.
const UNITS: [(&str, f64); 4] = [("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 0.001)];

/// `duration` in whole milliseconds, as stores record spans; one too long
/// for a `u64` (half a billion years) is held at its largest.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

const EXAMPLES: &str = "try 30s, 1.5m, 1h30m or 500ms";

/// Parses a duration; a bare number is seconds. Numbers are digits with at most
/// one dot (no sign, no exponent), so that a typo is refused rather than read as
/// something else; in a combination each unit appears once, largest first.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    // The index in UNITS of the last unit seen.
    let mut previous: Option<usize> = None;
    while !rest.is_empty() {
        let (number, after) =
            rest.split_at(rest.find(|c| !is_number_char(c)).unwrap_or(rest.len()));
        let (unit, next) = after.split_at(after.find(is_number_char).unwrap_or(after.len()));
        let value = number_value(number, text)?;
        let scale = if unit.is_empty() {
            if previous.is_some() {
                return Err(format!("'{text}' is missing a unit after its last number"));
            }
            1.0
        } else {
            let index = UNITS
                .iter()
                .position(|(name, _)| *name == unit)
                .ok_or_else(|| format!("unknown unit '{unit}' in '{text}' (use h, m, s or ms)"))?;
            match previous {
                Some(last) if last == index => {
                    return Err(format!("'{text}' has the unit {unit} twice ({EXAMPLES})"));
                }
                Some(last) if last > index => {
                    return Err(format!(
                        "'{text}' has {unit} after {}: write units from the largest (h, m, s, ms)",
                        UNITS[last].0
                    ));
                }
                _ => previous = Some(index),
            }
            UNITS[index].1
        };
        total = total.saturating_add(seconds_to_duration(value * scale, text)?);
        rest = next;
    }
    if total > LONGEST {
        return Err(format!("'{text}' is longer than 100 years"));
    }
    Ok(total)
}

fn is_number_char(c: char) -> bool {
    c.is_ascii_digit() || c == '.'
}

/// Digits with at most one dot: what `f64::from_str` reads beyond that (`+5`,
/// `1e3`, `inf`) is not a duration anyone means to write.
fn number_value(number: &str, text: &str) -> Result<f64, String> {
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.len() - digits > 1 {
        return Err(format!(
            "'{text}' is not a duration: a number is digits with at most one dot ({EXAMPLES})"
        ));
    }
    number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration ({EXAMPLES})"))
}

/// Parses a duration where `inf` means no limit.
pub fn parse_limit(text: &str) -> Result<Option<Duration>, String> {
    match text.trim() {
        "inf" | "infinity" => Ok(None),
        other => parse(other).map(Some),
    }
}

/// Longer than anything lockrun waits for; keeps every deadline computation far from overflow.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn seconds_to_duration(seconds: f64, text: &str) -> Result<Duration, String> {
    if seconds > LONGEST.as_secs_f64() {
        return Err(format!("'{text}' is longer than 100 years"));
    }
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| format!("'{text}' is not a duration of zero or more"))
}

/// Short human form: `850ms`, `12s`, `3m12s`, `1h2m`.
pub fn display(duration: Duration) -> String {
    let secs = duration.as_secs();
    if secs == 0 {
        format!("{}ms", duration.as_millis())
    } else if secs < 60 {
        let tenths = duration.subsec_millis() / 100;
        if tenths == 0 {
            format!("{secs}s")
        } else {
            format!("{secs}.{tenths}s")
        }
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_numbers_are_seconds() {
        assert_eq!(parse("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("0.25"), Ok(Duration::from_millis(250)));
    }

    #[test]
    fn units_and_combinations() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1m30s250ms"), Ok(Duration::from_millis(90_250)));
        assert_eq!(parse(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2.s"), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn says_what_is_wrong() {
        let error = |text| parse(text).unwrap_err();
        assert!(error("1h1h").contains("unit h twice"), "{}", error("1h1h"));
        assert!(error("30m1h").contains("h after m"), "{}", error("30m1h"));
        assert!(
            error("1e3").contains("unknown unit 'e'"),
            "{}",
            error("1e3")
        );
        assert!(
            error("+5").contains("digits with at most one dot"),
            "{}",
            error("+5")
        );
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "-1",
            "abc",
            "10x",
            "1h30",
            "nan",
            "s",
            "1..2s",
            "1e19",
            "99999999999h",
            "1e3",
            "+5",
            "1h1h",
            "30m1h",
            "1s500ms1s",
            ".",
            "1.5.5s",
            "inf",
            "0x10",
        ] {
            assert!(parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn inf_is_no_limit() {
        assert_eq!(parse_limit("inf"), Ok(None));
        assert_eq!(parse_limit("0"), Ok(Some(Duration::ZERO)));
    }

    #[test]
    fn displays_compactly() {
        assert_eq!(display(Duration::from_millis(850)), "850ms");
        assert_eq!(display(Duration::from_millis(1500)), "1.5s");
        assert_eq!(display(Duration::from_secs(192)), "3m12s");
        assert_eq!(display(Duration::from_secs(3720)), "1h02m");
    }
}
