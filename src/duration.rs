//! Duration values on the command line: `10`, `0.25`, `500ms`, `1h30m` (README: "Usage").

use std::time::Duration;

/// Parses a duration; a bare number is seconds.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return seconds_to_duration(seconds, text);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("'{text}' is missing a unit after its last number"))?;
        let unit_len = rest[number_len..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len() - number_len);
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("'{text}' is not a duration (try 30s, 1.5m, 1h30m or 500ms)"))?;
        let unit = &rest[number_len..number_len + unit_len];
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "unknown unit '{unit}' in '{text}' (use ms, s, m or h)"
                ));
            }
        };
        total = total.saturating_add(seconds_to_duration(number * scale, text)?);
        rest = &rest[number_len + unit_len..];
    }
    if total > LONGEST {
        return Err(format!("'{text}' is longer than 100 years"));
    }
    Ok(total)
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
