//! Timestamps of restore targets: PostgreSQL's text form parsed to microseconds since the Unix
//! epoch (to compare with the backups' times) and written back in UTC for pgBackRest, so the
//! target means the same moment whatever the servers' `timezone`.

/// Microseconds since 1970-01-01 00:00:00 UTC of `text`: `YYYY-MM-DD HH:MM[:SS[.ffffff]]`
/// (or with `T`), then optionally `Z`, `+HH`, `+HH:MM` or `+HHMM` (or `-`); without a zone the
/// time is UTC. `None` for anything else.
pub fn parse_timestamp(text: &str) -> Option<i64> {
    let text = text.trim();
    let (date, rest) = text.split_at(text.find([' ', 'T'])?);
    let rest = &rest[1..];
    let mut d = date.split('-');
    let year: i64 = number(d.next()?, 4)?;
    let month: i64 = number(d.next()?, 2)?;
    let day: i64 = number(d.next()?, 2)?;
    if d.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // The zone starts at the first Z, + or - after the clock.
    let zone_at = rest.find(['Z', 'z', '+', '-']).unwrap_or(rest.len());
    let (clock, zone) = rest.split_at(zone_at);
    let mut c = clock.trim().split(':');
    let hour: i64 = number(c.next()?, 2)?;
    let minute: i64 = number(c.next()?, 2)?;
    let (second, micros) = match c.next() {
        None => (0, 0),
        Some(s) => {
            let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
            if frac.len() > 6 || !frac.chars().all(|ch| ch.is_ascii_digit()) {
                return None;
            }
            let micros = if frac.is_empty() {
                0
            } else {
                format!("{frac:0<6}").parse::<i64>().ok()?
            };
            (number(whole, 2)?, micros)
        }
    };
    if c.next().is_some() || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let offset_s = offset_seconds(zone.trim())?;
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Some(seconds * 1_000_000 + micros)
}

/// `micros` since the epoch as `YYYY-MM-DD HH:MM:SS.ffffff+00`, which PostgreSQL's
/// `recovery_target_time` reads as UTC.
pub fn format_utc(micros: i64) -> String {
    let seconds = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let (days, secs) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{frac:06}+00",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn number(text: &str, digits: usize) -> Option<i64> {
    (text.len() == digits && text.chars().all(|c| c.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

fn offset_seconds(zone: &str) -> Option<i64> {
    if zone.is_empty() || zone.eq_ignore_ascii_case("z") {
        return Some(0);
    }
    let sign = match zone.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let body = zone[1..].replace(':', "");
    let (h, m) = match body.len() {
        2 => (number(&body, 2)?, 0),
        4 => (number(&body[..2], 2)?, number(&body[2..], 2)?),
        _ => return None,
    };
    Some(sign * (h * 3600 + m * 60))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
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
