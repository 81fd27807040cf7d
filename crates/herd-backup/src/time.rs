//! Timestamps of restore targets: PostgreSQL's text form parsed to microseconds since the Unix
//! epoch (to compare with the backups' times) and written back in UTC for pgBackRest, so the
//! target means the same moment whatever the servers' `timezone`.
//!
//! Parsing and calendar arithmetic are jiff's (a maintained date-time crate, RFC 3339 / ISO 8601
//! with offsets, leap years and month lengths checked), rather than code of our own; only UTC
//! and fixed offsets are used, so it is built without a time zone database.

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::Timestamp;

/// Microseconds since 1970-01-01 00:00:00 UTC of `text`: `YYYY-MM-DD HH:MM[:SS[.ffffff]]`
/// (or with `T`), then optionally `Z`, `+HH`, `+HH:MM` or `+HHMM` (or `-`); without a zone the
/// time is UTC. `None` for anything else, a date without a clock, and a fraction finer than a
/// microsecond (PostgreSQL's precision).
pub fn parse_timestamp(text: &str) -> Option<i64> {
    let text = text.trim();
    // A date alone is not a moment: a clock must follow it.
    if !matches!(text.as_bytes().get(10), Some(b' ' | b'T' | b't')) {
        return None;
    }
    let clock = text.get(11..)?;
    let ts = if clock.contains(['Z', 'z', '+', '-']) {
        text.parse::<Timestamp>().ok()?
    } else {
        // No offset: UTC (jiff's civil time, which alone would ignore an offset, is only
        // used when there is none).
        TimeZone::UTC
            .to_timestamp(text.parse::<DateTime>().ok()?)
            .ok()?
    };
    if ts.subsec_nanosecond() % 1000 != 0 {
        return None;
    }
    Some(ts.as_microsecond())
}

/// `micros` since the epoch as `YYYY-MM-DD HH:MM:SS.ffffff+00`, which PostgreSQL's
/// `recovery_target_time` reads as UTC.
pub fn format_utc(micros: i64) -> String {
    let Ok(ts) = Timestamp::from_microsecond(micros) else {
        return format!("{micros} µs after 1970 (out of range)");
    };
    let t = TimeZone::UTC.to_datetime(ts);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}+00",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.subsec_nanosecond() / 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_and_iso_forms() {
        // 2026-11-28 13:20:32 UTC.
        let t = 1_795_872_032_000_000;
        assert_eq!(parse_timestamp("2026-11-28 13:20:32"), Some(t));
        assert_eq!(parse_timestamp("2026-11-28T13:20:32Z"), Some(t));
        assert_eq!(parse_timestamp("2026-11-28 13:20:32+00"), Some(t));
        assert_eq!(parse_timestamp("2026-11-28 14:20:32+01:00"), Some(t));
        assert_eq!(parse_timestamp("2026-11-28 08:20:32-0500"), Some(t));
        assert_eq!(parse_timestamp("2026-11-28 13:20"), Some(t - 32_000_000));
        assert_eq!(
            parse_timestamp("2026-11-28 13:20:32.1234+00"),
            Some(t + 123_400)
        );
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0));
        assert_eq!(
            parse_timestamp("2000-02-29 00:00:00"),
            Some(951_782_400_000_000)
        );
    }

    #[test]
    fn garbage_is_refused() {
        for bad in [
            "",
            "latest",
            "2026-11-28",
            "2026-13-01 00:00:00",
            "2026-11-28 25:00:00",
            "2026-11-28 13:20:32.1234567",
            "2026-11-28 13:20:32 CET",
            "26-11-28 13:20:32",
            "2026-02-30 00:00:00",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn formatting_round_trips() {
        for text in [
            "2026-11-28 13:20:32.000001+00",
            "1999-12-31 23:59:59.999999+00",
            "2024-02-29 00:00:00.000000+00",
        ] {
            let t = parse_timestamp(text).expect(text);
            assert_eq!(format_utc(t), text);
        }
    }
}
