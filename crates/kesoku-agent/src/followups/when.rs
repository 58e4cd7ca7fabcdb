//! Reading when a follow-up is due, and writing times back for people and the model.
//!
//! [`parse_when`] takes what the model writes — an RFC 3339 time with its offset, a local time
//! in the turn's time zone, or a delay (`90s`, `10m`, `2h`, `1d`, `1h30m`) — and answers a UTC
//! instant between now and a year ahead, or an error that says what to write instead. A local
//! time that does not exist (the hour skipped when daylight saving time starts) or exists twice
//! (the hour repeated when it ends) is refused with the offsets to choose from, never guessed.
//! A delay is exact elapsed time: `1d` is 24 hours, also across a DST change.

use std::str::FromStr;

use chrono::offset::LocalResult;
use chrono::{DateTime, Duration, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

/// How far ahead a follow-up may be.
pub const MAX_AHEAD: Duration = Duration::days(365);

/// Local-time layouts accepted without an offset (read in the turn's time zone).
const LOCAL_FORMATS: [&str; 4] = ["%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"];

/// Why a `when` was refused. The text is written for the model, which corrects its call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhenError {
    #[error(
        "`when` is empty: give an RFC 3339 time with its offset (`2026-12-06T09:00:00+01:00`), a local time \
         (`2026-12-06 09:00`) or a delay (`90s`, `10m`, `2h`, `1d`, `1h30m`)"
    )]
    Empty,
    #[error(
        "`{when}` is neither a time nor a delay: give an RFC 3339 time with its offset \
         (`2026-12-06T09:00:00+01:00`), a local time in {timezone} (`2026-12-06 09:00`), or a delay made of a \
         number and a unit, largest unit first (`90s`, `10m`, `2h`, `1d`, `1h30m`; d = days, h = hours, \
         m = minutes, s = seconds)"
    )]
    Unrecognized { when: String, timezone: String },
    #[error("`{when}` is no time from now: a delay must be more than zero")]
    ZeroDelay { when: String },
    #[error("`{when}` is in the past (it is now {now}): give a time ahead")]
    Past { when: String, now: String },
    #[error("`{when}` is more than a year ahead ({due}): a follow-up can be at most 365 days away")]
    TooFar { when: String, due: String },
    #[error(
        "`{when}` does not exist in {timezone}: the clocks skip that hour when daylight saving time starts; \
         pick another time, or write it with an offset"
    )]
    Nonexistent { when: String, timezone: String },
    #[error(
        "`{when}` happens twice in {timezone} (the clocks go back that night): write it with its offset, \
         `{earlier}` (the first time) or `{later}` (the second)"
    )]
    Ambiguous { when: String, timezone: String, earlier: String, later: String },
}

/// When `when` falls, read at `now` in `timezone` (the turn's; used for local times and for the
/// times in errors).
pub fn parse_when(when: &str, now: DateTime<Utc>, timezone: Tz) -> Result<DateTime<Utc>, WhenError> {
    let text = when.trim();
    if text.is_empty() {
        return Err(WhenError::Empty);
    }
    let due = if let Some(delay) = parse_delay(text) {
        let delay = delay.map_err(|()| WhenError::ZeroDelay { when: text.to_owned() })?;
        // A delay beyond what a DateTime holds is certainly more than a year.
        now.checked_add_signed(delay).unwrap_or(DateTime::<Utc>::MAX_UTC)
    } else if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        at.with_timezone(&Utc)
    } else if let Some(local) = parse_local(text) {
        match timezone.from_local_datetime(&local) {
            LocalResult::Single(at) => at.with_timezone(&Utc),
            LocalResult::None => {
                return Err(WhenError::Nonexistent { when: text.to_owned(), timezone: timezone.name().to_owned() });
            }
            LocalResult::Ambiguous(earlier, later) => {
                return Err(WhenError::Ambiguous {
                    when: text.to_owned(),
                    timezone: timezone.name().to_owned(),
                    earlier: earlier.to_rfc3339(),
                    later: later.to_rfc3339(),
                });
            }
        }
    } else {
        return Err(WhenError::Unrecognized { when: text.to_owned(), timezone: timezone.name().to_owned() });
    };
    if due <= now {
        return Err(WhenError::Past { when: text.to_owned(), now: format_local(now, timezone) });
    }
    if due - now > MAX_AHEAD {
        return Err(WhenError::TooFar { when: text.to_owned(), due: format_local(due, timezone) });
    }
    Ok(due)
}

/// A delay such as `90s`, `10m`, `2h`, `1d` or `1h30m` (spaces between parts allowed): `None`
/// when `text` is not written as one, `Err` when it is but adds up to zero. A delay too large
/// to hold is the largest duration (refused later as more than a year ahead).
fn parse_delay(text: &str) -> Option<Result<Duration, ()>> {
    const UNITS: [(char, i64); 4] = [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)];
    let mut seconds: i64 = 0;
    // Units come largest first, each at most once: `1h30m`, not `30m1h` or `1h1h`.
    let mut next_unit = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return None;
        }
        // Only ASCII digits: parsing fails only when the number does not fit.
        let number: i64 = rest[..digits].parse().unwrap_or(i64::MAX);
        let unit = rest[digits..].chars().next()?;
        let index = UNITS.iter().position(|(name, _)| *name == unit.to_ascii_lowercase())?;
        if index < next_unit {
            return None;
        }
        next_unit = index + 1;
        seconds = seconds.saturating_add(number.saturating_mul(UNITS[index].1));
        rest = rest[digits + unit.len_utf8()..].trim_start();
    }
    if seconds == 0 {
        return Some(Err(()));
    }
    Some(Ok(Duration::try_seconds(seconds).unwrap_or(Duration::MAX)))
}

fn parse_local(text: &str) -> Option<NaiveDateTime> {
    LOCAL_FORMATS.iter().find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
}

/// The IANA zone named `name`, or `None` when it names none.
pub fn parse_zone(name: &str) -> Option<Tz> {
    Tz::from_str(name.trim()).ok()
}

/// `2026-12-06 09:00:00 CET`: a time as a person in `timezone` reads it (with the zone's
/// abbreviation, so a DST change shows).
pub fn format_local(at: DateTime<Utc>, timezone: Tz) -> String {
    at.with_timezone(&timezone).format("%Y-%m-%d %H:%M:%S %Z").to_string()
}

/// `in 2h`, `in 1h 30m`, `in 1d 2h`, `in 45s`: how far `at` is from `now`, in the two largest
/// units (rounded down); `now` when it is not ahead.
pub fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (at - now).num_seconds();
    if seconds <= 0 {
        return "now".to_owned();
    }
    let parts =
        [(seconds / 86_400, "d"), (seconds % 86_400 / 3_600, "h"), (seconds % 3_600 / 60, "m"), (seconds % 60, "s")];
    let shown: Vec<String> = parts
        .iter()
        .skip_while(|(value, _)| *value == 0)
        .take(2)
        .filter(|(value, _)| *value > 0)
        .map(|(value, unit)| format!("{value}{unit}"))
        .collect();
    format!("in {}", shown.join(" "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]

    use super::*;

    fn paris() -> Tz {
        parse_zone("Europe/Paris").expect("a zone")
    }

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).expect("a time").with_timezone(&Utc)
    }

    /// `when` read at 2026-12-05 10:00 UTC (11:00 in Paris).
    fn check(when: &str) -> Result<String, String> {
        parse_when(when, utc("2026-12-05T10:00:00Z"), paris())
            .map(|at| at.to_rfc3339())
            .map_err(|error| error.to_string())
    }

    #[test]
    fn delays_add_exact_time() {
        let cases = [
            ("90s", "2026-12-05T10:01:30+00:00"),
            ("10m", "2026-12-05T10:10:00+00:00"),
            ("2h", "2026-12-05T12:00:00+00:00"),
            ("1d", "2026-12-06T10:00:00+00:00"),
            ("1h30m", "2026-12-05T11:30:00+00:00"),
            (" 1h 30m ", "2026-12-05T11:30:00+00:00"),
            ("1d2h3m4s", "2026-12-06T12:03:04+00:00"),
            ("365d", "2027-12-05T10:00:00+00:00"),
        ];
        for (when, expected) in cases {
            assert_eq!(check(when), Ok(expected.to_owned()), "{when}");
        }
    }

    #[test]
    fn times_with_an_offset_and_local_times_in_the_turns_zone() {
        assert_eq!(check("2026-12-06T09:00:00+01:00"), Ok("2026-12-06T08:00:00+00:00".to_owned()));
        assert_eq!(check("2026-12-06T08:00:00Z"), Ok("2026-12-06T08:00:00+00:00".to_owned()));
        // Without an offset: Paris time (CET, +01:00, in December).
        assert_eq!(check("2026-12-06 09:00"), Ok("2026-12-06T08:00:00+00:00".to_owned()));
        assert_eq!(check("2026-12-06T09:00:30"), Ok("2026-12-06T08:00:30+00:00".to_owned()));
        // In summer Paris is +02:00.
        assert_eq!(check("2027-07-01 09:00"), Ok("2027-07-01T07:00:00+00:00".to_owned()));
    }

    #[test]
    fn local_times_in_a_dst_gap_or_overlap_are_refused_with_the_choices() {
        // 2027-03-28 02:30 is skipped in Paris; 2027-10-31 02:30 happens twice.
        let gap = check("2027-03-28 02:30").expect_err("skipped hour");
        assert!(gap.contains("does not exist in Europe/Paris"), "{gap}");
        let overlap = check("2027-10-31 02:30").expect_err("repeated hour");
        assert!(overlap.contains("happens twice in Europe/Paris"), "{overlap}");
        assert!(overlap.contains("`2027-10-31T02:30:00+02:00`") && overlap.contains("`2027-10-31T02:30:00+01:00`"));
        // With its offset the same time is accepted.
        assert_eq!(check("2027-10-31T02:30:00+01:00"), Ok("2027-10-31T01:30:00+00:00".to_owned()));
    }

    #[test]
    fn nonsense_past_zero_and_too_far_are_clear_errors() {
        let cases = [
            ("", "`when` is empty"),
            ("tomorrow", "`tomorrow` is neither a time nor a delay"),
            ("10 minutes", "`10 minutes` is neither a time nor a delay"),
            ("30m1h", "neither a time nor a delay"),
            ("1h1h", "neither a time nor a delay"),
            ("-5m", "neither a time nor a delay"),
            ("0s", "`0s` is no time from now"),
            ("2026-12-05T09:00:00Z", "is in the past (it is now 2026-12-05 11:00:00 CET)"),
            ("2026-12-05 11:00", "is in the past"),
            ("366d", "more than a year ahead (2027-12-06 11:00:00 CET)"),
            ("99999999999999999d", "more than a year ahead"),
            ("2030-01-01T00:00:00Z", "more than a year ahead"),
        ];
        for (when, expected) in cases {
            let error = check(when).expect_err(when);
            assert!(error.contains(expected), "{when}: {error}");
        }
    }

    #[test]
    fn relative_times_show_the_two_largest_units() {
        let now = utc("2026-12-05T10:00:00Z");
        let cases = [
            (Duration::seconds(45), "in 45s"),
            (Duration::seconds(90), "in 1m 30s"),
            (Duration::hours(2), "in 2h"),
            (Duration::minutes(90), "in 1h 30m"),
            (Duration::seconds(86_400 + 7_200 + 59), "in 1d 2h"),
            (Duration::seconds(86_400 + 59), "in 1d"),
            (Duration::zero(), "now"),
        ];
        for (ahead, expected) in cases {
            assert_eq!(relative(now + ahead, now), expected);
        }
    }

    #[test]
    fn local_times_show_the_zone_in_force() {
        assert_eq!(format_local(utc("2026-03-28T10:00:00Z"), paris()), "2026-03-28 11:00:00 CET");
        assert_eq!(format_local(utc("2026-03-29T10:00:00Z"), paris()), "2026-03-29 12:00:00 CEST");
        assert_eq!(format_local(utc("2026-03-29T10:00:00Z"), Tz::UTC), "2026-03-29 10:00:00 UTC");
    }
}
