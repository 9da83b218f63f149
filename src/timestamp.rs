//! RFC 3339 timestamps in UTC, for events and `status`.

use std::time::SystemTime;

use crate::identity::epoch_millis;

/// `2026-11-21T12:56:05.123Z` for milliseconds since the Unix epoch.
pub fn rfc3339(millis: u64) -> String {
    format!("{}.{:03}Z", date_time(millis / 1000), millis % 1000)
}

/// `2026-11-21T12:56:05Z`: whole seconds, for people.
pub fn rfc3339_seconds(millis: u64) -> String {
    format!("{}Z", date_time(millis / 1000))
}

fn date_time(secs: u64) -> String {
    let (year, month, day) = civil_from_days((secs / 86_400).cast_signed());
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
    )
}

pub fn now_rfc3339() -> String {
    rfc3339(epoch_millis(SystemTime::now()))
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_265_765_123), "2026-11-21T12:56:05.123Z");
        assert_eq!(rfc3339_seconds(1_795_265_765_923), "2026-11-21T12:56:05Z");
    }
}
