//! The one duration grammar of kbind, for every duration flag (`--deadline`, `--request-timeout`,
//! `--lease-duration`, …) and every duration field (`spec.sync.interval`): Go's
//! `time.ParseDuration`, what Kubernetes users write (`300ms`, `1.5h`, `1h30m`, `2m3.5s`; units
//! `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`; no days; a bare number only as `0`), with two limits of
//! ours: no negative durations, and at most [`MAX`] (arithmetic on a flag or a tenant's field
//! must never overflow, and longer is a typo). Surrounding whitespace is ignored.

use std::time::Duration;

/// The longest duration accepted: a year (8760h).
pub const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// What is wrong with a duration; each variant quotes the text (never a secret: flags and spec
/// fields only).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration: expected e.g. 90s, 10m, 1h30m or 1.5h")]
    Empty,
    #[error("{0:?}: negative durations are refused")]
    Negative(String),
    #[error("{0:?}: expected a duration like 90s, 10m, 1h30m or 1.5h")]
    Invalid(String),
    #[error("{0:?}: a number needs a unit (ns, us, ms, s, m, h)")]
    MissingUnit(String),
    #[error("{text:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h; there are no days)")]
    UnknownUnit { text: String, unit: String },
    #[error("{0:?} is too long (at most 8760h)")]
    TooLong(String),
}

/// Nanoseconds per unit, as Go's `unitMap`.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Go's `leadingFraction`: the fraction's digits as an integer and its scale (a power of ten),
/// ignoring digits past what a u64 holds.
fn leading_fraction(frac: &str) -> (u64, f64) {
    let (mut x, mut scale) = (0u64, 1f64);
    for d in frac.bytes() {
        let Some(y) = x
            .checked_mul(10)
            .and_then(|y| y.checked_add(u64::from(d - b'0')))
            .filter(|y| *y <= 1 << 63)
        else {
            break;
        };
        x = y;
        scale *= 10.0;
    }
    (x, scale)
}

/// Parse a duration (see the module documentation).
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    let owned = || s.to_string();
    let rest = match s.as_bytes().first() {
        None => return Err(DurationError::Empty),
        Some(b'-') => return Err(DurationError::Negative(owned())),
        Some(b'+') => &s[1..],
        Some(_) => s,
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Invalid(owned()));
    }
    let max = MAX.as_nanos();
    let mut total: u128 = 0;
    let mut rest = rest;
    while !rest.is_empty() {
        // [0-9]*(\.[0-9]*)?
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => a.split_at(a.bytes().take_while(u8::is_ascii_digit).count()),
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(DurationError::Invalid(owned()));
        }
        // [a-zµμ]+: everything up to the next number.
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(DurationError::MissingUnit(owned()));
        }
        let per = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
            text: owned(),
            unit: unit.to_string(),
        })?;
        // The whole part: more digits than a u128 holds is too long anyway.
        let whole: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| DurationError::TooLong(owned()))?
        };
        let mut nanos = whole
            .checked_mul(per)
            .ok_or_else(|| DurationError::TooLong(owned()))?;
        let (digits, scale) = leading_fraction(frac);
        if digits > 0 {
            // As Go computes it (a float), so `0.3333333333333333333h` is 20m there and here.
            nanos += (digits as f64 * (per as f64 / scale)) as u128;
        }
        total = total
            .checked_add(nanos)
            .filter(|t| *t <= max)
            .ok_or_else(|| DurationError::TooLong(owned()))?;
        rest = next;
    }
    // At most MAX, so it fits a u64 of nanoseconds.
    Ok(Duration::from_nanos(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    /// Go's own table (time/time_test.go `parseDurationTests`), within our limits.
    #[test]
    fn go_grammar() {
        let ok = [
            ("0", ns(0)),
            ("5s", Duration::from_secs(5)),
            ("30s", Duration::from_secs(30)),
            ("1478s", Duration::from_secs(1478)),
            ("+5s", Duration::from_secs(5)),
            ("+0", ns(0)),
            ("5.0s", Duration::from_secs(5)),
            ("5.6s", Duration::from_millis(5600)),
            ("5.s", Duration::from_secs(5)),
            (".5s", Duration::from_millis(500)),
            ("1.0s", Duration::from_secs(1)),
            ("1.00s", Duration::from_secs(1)),
            ("1.004s", Duration::from_millis(1004)),
            ("1.0040s", Duration::from_millis(1004)),
            ("100.00100s", Duration::from_millis(100_001)),
            ("10ns", ns(10)),
            ("11us", ns(11_000)),
            ("12µs", ns(12_000)),
            ("12μs", ns(12_000)),
            ("13ms", Duration::from_millis(13)),
            ("14s", Duration::from_secs(14)),
            ("15m", Duration::from_secs(900)),
            ("16h", Duration::from_secs(16 * 3600)),
            ("3h30m", Duration::from_secs(3 * 3600 + 1800)),
            ("10.5s4m", Duration::from_millis(4 * 60_000 + 10_500)),
            ("1h2m3s4ms5us6ns", ns(3_723_004_005_006)),
            ("39h9m14.425s", Duration::from_millis(140_954_425)),
            ("52763797000ns", ns(52_763_797_000)),
            ("0.3333333333333333333h", Duration::from_secs(20 * 60)),
            ("9007199254740993ns", ns(9_007_199_254_740_993)),
            ("0.100000000000000000000h", Duration::from_secs(360)),
            ("0.830103483285477580700h", ns(2_988_372_539_827)),
            // Checked against time.ParseDuration of Go 1.26.
            ("1.h", Duration::from_secs(3600)),
            ("1.000000000000000000000000000001s", Duration::from_secs(1)),
            ("1234567.123456789s", ns(1_234_567_123_456_789)),
            ("0.0000000001s", ns(0)),
            ("1.9999999999h", ns(7_199_999_999_640)),
            // What the issue and the docs name.
            ("1.5h", Duration::from_secs(5400)),
            ("1h30m", Duration::from_secs(5400)),
            ("300ms", Duration::from_millis(300)),
            ("2m3.5s", Duration::from_millis(123_500)),
            ("1h0m0s", Duration::from_secs(3600)),
            (" 10m ", Duration::from_secs(600)),
            ("0s", ns(0)),
            ("8760h", MAX),
        ];
        for (s, want) in ok {
            assert_eq!(parse(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn refused_with_the_reason() {
        use DurationError::*;
        type Is = fn(&DurationError) -> bool;
        let cases: [(&str, Is); 21] = [
            ("1.", |e| matches!(e, MissingUnit(_))),
            (".h", |e| matches!(e, Invalid(_))),
            ("", |e| *e == Empty),
            ("  ", |e| *e == Empty),
            ("3", |e| matches!(e, MissingUnit(_))),
            ("90", |e| matches!(e, MissingUnit(_))),
            ("10m5", |e| matches!(e, MissingUnit(_))),
            ("-", |e| matches!(e, Negative(_))),
            ("-5m", |e| matches!(e, Negative(_))),
            ("-0", |e| matches!(e, Negative(_))),
            ("s", |e| matches!(e, Invalid(_))),
            (".", |e| matches!(e, Invalid(_))),
            (".s", |e| matches!(e, Invalid(_))),
            ("+.s", |e| matches!(e, Invalid(_))),
            ("+", |e| matches!(e, Invalid(_))),
            (
                "1d",
                |e| matches!(e, UnknownUnit { unit, .. } if unit == "d"),
            ),
            (
                "1h 30m",
                |e| matches!(e, UnknownUnit { unit, .. } if unit == "h "),
            ),
            ("8761h", |e| matches!(e, TooLong(_))),
            ("8760h1ns", |e| matches!(e, TooLong(_))),
            ("5124095576030431h", |e| matches!(e, TooLong(_))),
            ("99999999999999999999999999999999999999999h", |e| {
                matches!(e, TooLong(_))
            }),
        ];
        for (s, want) in cases {
            let got = parse(s);
            assert!(got.as_ref().is_err_and(want), "{s:?}: {got:?}");
        }
    }

    #[test]
    fn messages_quote_the_input_and_say_what_to_write() {
        let e = |s| parse(s).unwrap_err().to_string();
        assert_eq!(
            e("15"),
            "\"15\": a number needs a unit (ns, us, ms, s, m, h)"
        );
        assert_eq!(e("-5m"), "\"-5m\": negative durations are refused");
        assert_eq!(e("9999h"), "\"9999h\" is too long (at most 8760h)");
        assert!(e("2d").contains("no days"), "{}", e("2d"));
    }
}
