//! Cron expressions in a time zone, and the ticks they give between two
//! instants: plain functions, no I/O.
//!
//! An expression has 5 fields (minute hour day-of-month month day-of-week)
//! or 6 (a leading seconds field); `@hourly`, `@daily`... are accepted.
//! Ticks are computed in the schedule's IANA time zone, so `0 9 * * *` in
//! `Europe/Paris` is 09:00 Paris time in winter and in summer. Across a
//! daylight-saving change (croner's rules, after Vixie cron): a fixed time
//! that falls into the skipped hour fires right after the gap, one that
//! occurs twice fires once; wildcard and step fields fire per real instant.

use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// Why an expression or time zone is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// The expression does not parse, or has the wrong number of fields.
    #[error("cron expression {expr:?} is invalid: {why} (use 5 fields `min hour day month weekday`, or 6 with a leading seconds field)")]
    Expr {
        /// As given.
        expr: String,
        /// What is wrong.
        why: String,
    },
    /// Not an IANA time zone name.
    #[error("unknown time zone {tz:?}: use an IANA name such as `UTC` or `Europe/Paris`")]
    Tz {
        /// As given.
        tz: String,
    },
}

/// A parsed expression and its time zone.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: Cron,
    tz: Tz,
}

/// What [`CronSpec::parse`] reads.
pub struct SpecText<'a> {
    /// The cron expression.
    pub expr: &'a str,
    /// The IANA time zone name.
    pub tz: &'a str,
}

/// Most ticks one call enumerates (a bound on the work of a backfill or a
/// catch-up over a long downtime).
pub const MAX_TICKS: usize = 100_000;

impl CronSpec {
    /// Parse `expr` (5 or 6 fields, or an `@` nickname) in time zone `tz`.
    pub fn parse(t: SpecText<'_>) -> Result<Self, CronError> {
        let tz = Tz::from_str(t.tz.trim()).map_err(|_| CronError::Tz { tz: t.tz.into() })?;
        let bad = |why: String| CronError::Expr {
            expr: t.expr.into(),
            why,
        };
        let fields = t.expr.split_whitespace().count();
        let nickname = t.expr.trim_start().starts_with('@');
        if !nickname && !(5..=6).contains(&fields) {
            return Err(bad(format!("it has {fields} fields")));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(t.expr)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self { cron, tz })
    }

    /// The time zone.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The first tick strictly after `t`, if any (a pattern such as
    /// `0 0 30 2 *` has none).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        self.cron
            .find_next_occurrence(&local, false)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }

    /// The last tick at or before `t`, if any.
    pub fn last_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        self.cron
            .find_previous_occurrence(&local, true)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }

    /// The ticks in `(after, until]`, oldest first, at most `limit` of
    /// them: the most recent ones when more are due (what a catch-up
    /// after a downtime keeps).
    pub fn recent_ticks(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut cursor = until;
        let mut inclusive = true;
        while out.len() < limit.min(MAX_TICKS) {
            let local = cursor.with_timezone(&self.tz);
            let Ok(prev) = self.cron.find_previous_occurrence(&local, inclusive) else {
                break;
            };
            let prev = prev.with_timezone(&Utc);
            if prev <= after {
                break;
            }
            out.push(prev);
            cursor = prev;
            inclusive = false;
        }
        out.reverse();
        out
    }

    /// The ticks in `[from, to]`, oldest first; `Err(n)` when there are
    /// more than `limit` (`n` = `limit + 1`, the count reached).
    pub fn ticks_in(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<DateTime<Utc>>, usize> {
        let mut out = Vec::new();
        let local = from.with_timezone(&self.tz);
        let mut next = self.cron.find_next_occurrence(&local, true).ok();
        while let Some(t) = next {
            let t_utc = t.with_timezone(&Utc);
            if t_utc > to {
                break;
            }
            if out.len() == limit {
                return Err(limit + 1);
            }
            out.push(t_utc);
            next = self.cron.find_next_occurrence(&t, false).ok();
        }
        Ok(out)
    }
}

/// The canonical text of a tick: RFC 3339 in UTC, whole seconds
/// (`2026-03-29T01:00:00Z`). Every replica formats a tick the same way, so
/// the execution id derived from it is the same.
pub fn tick_text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Parse an instant given on a command line or stored: RFC 3339 with an
/// offset (`2026-03-29T01:00:00Z`, `...+02:00`), or a local date-time
/// `YYYY-MM-DDTHH:MM[:SS]` or a date `YYYY-MM-DD` read in `tz`.
pub fn parse_instant(text: &str, tz: Tz) -> Option<DateTime<Utc>> {
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    let naive = ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(text, f).ok())
        .or_else(|| {
            chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
        })?;
    tz.from_local_datetime(&naive)
        .earliest()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(expr: &str, tz: &str) -> CronSpec {
        CronSpec::parse(SpecText { expr, tz }).unwrap()
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn texts(ticks: &[DateTime<Utc>]) -> Vec<String> {
        ticks.iter().map(|t| tick_text(*t)).collect()
    }

    #[test]
    fn five_fields_tick_on_minutes_six_fields_on_seconds() {
        let five = spec("*/15 * * * *", "UTC");
        assert_eq!(
            texts(&five.recent_ticks(at("2026-01-01T00:00:00Z"), at("2026-01-01T00:46:00Z"), 10)),
            [
                "2026-01-01T00:15:00Z",
                "2026-01-01T00:30:00Z",
                "2026-01-01T00:45:00Z"
            ]
        );
        let six = spec("*/20 * * * * *", "UTC");
        assert_eq!(
            texts(&six.recent_ticks(at("2026-01-01T00:00:00Z"), at("2026-01-01T00:01:00Z"), 10)),
            [
                "2026-01-01T00:00:20Z",
                "2026-01-01T00:00:40Z",
                "2026-01-01T00:01:00Z"
            ]
        );
        assert_eq!(
            tick_text(six.next_after(at("2026-01-01T00:00:40Z")).unwrap()),
            "2026-01-01T00:01:00Z"
        );
        let daily = spec("@daily", "UTC");
        assert_eq!(
            tick_text(daily.next_after(at("2026-01-01T10:00:00Z")).unwrap()),
            "2026-01-02T00:00:00Z"
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused_naming_what_is_wrong() {
        for bad in ["* * * *", "* * * * * * *", "61 * * * *", "nonsense", ""] {
            let e = CronSpec::parse(SpecText {
                expr: bad,
                tz: "UTC",
            })
            .unwrap_err();
            assert!(matches!(e, CronError::Expr { .. }), "{bad}: {e}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        let e = CronSpec::parse(SpecText {
            expr: "* * * * *",
            tz: "Mars/Olympus",
        })
        .unwrap_err();
        assert_eq!(
            e,
            CronError::Tz {
                tz: "Mars/Olympus".into()
            }
        );
    }

    #[test]
    fn a_fixed_local_time_follows_the_zone_across_a_dst_change() {
        // Paris: CET (+1) until 2026-03-29 01:00 UTC, then CEST (+2).
        let nine = spec("0 9 * * *", "Europe/Paris");
        let ticks = nine.ticks_in(at("2026-03-27T00:00:00Z"), at("2026-03-31T00:00:00Z"), 10);
        assert_eq!(
            texts(&ticks.unwrap()),
            [
                "2026-03-27T08:00:00Z",
                "2026-03-28T08:00:00Z",
                "2026-03-29T07:00:00Z",
                "2026-03-30T07:00:00Z"
            ]
        );
        // 02:30 does not exist on 2026-03-29 in Paris: it fires once,
        // right after the gap (03:00 CEST = 01:00 UTC).
        let gap = spec("30 2 * * *", "Europe/Paris");
        let ticks = gap
            .ticks_in(at("2026-03-28T12:00:00Z"), at("2026-03-30T12:00:00Z"), 10)
            .unwrap();
        assert_eq!(ticks.len(), 2, "{:?}", texts(&ticks));
        assert_eq!(tick_text(ticks[0]), "2026-03-29T01:00:00Z");
        assert_eq!(tick_text(ticks[1]), "2026-03-30T00:30:00Z");
        // 02:30 happens twice on 2026-10-25 in Paris: it fires once.
        let twice = gap
            .ticks_in(at("2026-10-24T12:00:00Z"), at("2026-10-25T12:00:00Z"), 10)
            .unwrap();
        assert_eq!(texts(&twice), ["2026-10-25T00:30:00Z"]);
    }

    #[test]
    fn recent_ticks_keep_the_most_recent_within_the_limit() {
        let every_minute = spec("* * * * *", "UTC");
        let after = at("2026-01-01T00:00:00Z");
        let until = at("2026-01-01T01:00:30Z");
        let last3 = every_minute.recent_ticks(after, until, 3);
        assert_eq!(
            texts(&last3),
            [
                "2026-01-01T00:58:00Z",
                "2026-01-01T00:59:00Z",
                "2026-01-01T01:00:00Z"
            ]
        );
        assert_eq!(every_minute.recent_ticks(after, until, 1000).len(), 60);
        // `after` itself is excluded, `until` included.
        let exact = every_minute.recent_ticks(after, at("2026-01-01T00:01:00Z"), 10);
        assert_eq!(texts(&exact), ["2026-01-01T00:01:00Z"]);
        assert!(every_minute.recent_ticks(after, after, 10).is_empty());
    }

    #[test]
    fn ticks_in_a_range_are_bounded() {
        let s = spec("* * * * * *", "UTC");
        let r = s.ticks_in(at("2026-01-01T00:00:00Z"), at("2026-01-01T00:00:04Z"), 10);
        assert_eq!(r.unwrap().len(), 5, "both ends included");
        let r = s.ticks_in(at("2026-01-01T00:00:00Z"), at("2026-01-01T01:00:00Z"), 10);
        assert_eq!(r, Err(11));
    }

    #[test]
    fn instants_parse_with_an_offset_or_in_the_zone() {
        let paris: Tz = "Europe/Paris".parse().unwrap();
        assert_eq!(
            parse_instant("2026-01-01T10:00:00+01:00", paris),
            Some(at("2026-01-01T09:00:00Z"))
        );
        assert_eq!(
            parse_instant("2026-07-01T10:00", paris),
            Some(at("2026-07-01T08:00:00Z"))
        );
        assert_eq!(
            parse_instant("2026-07-01", paris),
            Some(at("2026-06-30T22:00:00Z"))
        );
        assert_eq!(parse_instant("yesterday", paris), None);
    }
}
