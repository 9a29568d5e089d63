//! The log's lines, one per event, and the subscriber that writes them.
//!
//! A line reads `2026-11-30T11:51:55.688967Z  INFO nvhook::hook: message key=value`: the layout
//! tracing-subscriber's `fmt` writes, which operators and the bench already read. nvhook keeps no
//! spans, so the subscriber keeps nothing between events: every nvhook process that works on a
//! container starts it, and a registry of spans is set-up work each of them would pay for nothing.
//!
//! Nothing in a line can start another: control characters in messages and values, which may
//! come from an image (a path, a name), are written as escapes.

use std::fmt::{self, Write as _};
use std::io::Write;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Writes each event at `max` or more severe to `out` in one `write` call.
pub struct Lines<W> {
    max: Level,
    /// Whether lines start with the time (stderr's, which the runtime shows, do not).
    time: bool,
    out: Mutex<W>,
}

impl<W: Write + Send + 'static> Lines<W> {
    pub fn new(max: Level, time: bool, out: W) -> Lines<W> {
        Lines {
            max,
            time,
            out: Mutex::new(out),
        }
    }

    /// Makes it the process's subscriber; a second one is ignored, as the first keeps writing.
    pub fn install(self) {
        let _ = tracing::subscriber::set_global_default(self);
    }
}

impl<W: Write + Send + 'static> Subscriber for Lines<W> {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.max
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::from_level(self.max))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let line = line(self.time.then(SystemTime::now), event);
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // A log that cannot be written has nowhere to say so.
        let _ = out.write_all(line.as_bytes());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// One event's line, newline included: its time (if any), level, target, then its fields.
fn line(time: Option<SystemTime>, event: &Event<'_>) -> String {
    let metadata = event.metadata();
    let mut line = String::with_capacity(160);
    if let Some(time) = time {
        let _ = write!(line, "{} ", Utc(time));
    }
    let level = match *metadata.level() {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        Level::ERROR => "ERROR",
    };
    let _ = write!(line, "{level} {}: ", metadata.target());
    let mut fields = Fields {
        line: Escaped(&mut line),
        first: true,
    };
    event.record(&mut fields);
    line.push('\n');
    line
}

/// The fields of an event: the message as it is, the others as `name=value` with the value's
/// `Debug` form (a `%` field's is its `Display`), an error with its sources.
struct Fields<'a> {
    line: Escaped<'a>,
    first: bool,
}

impl Fields<'_> {
    fn start(&mut self, field: &Field) {
        if !std::mem::take(&mut self.first) {
            self.line.0.push(' ');
        }
        if field.name() != "message" {
            let name = field.name();
            let _ = write!(self.line.0, "{}=", name.strip_prefix("r#").unwrap_or(name));
        }
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.start(field);
        let _ = write!(self.line, "{value:?}");
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.start(field);
        let _ = match field.name() {
            "message" => self.line.write_str(value),
            _ => write!(self.line, "{value:?}"),
        };
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.start(field);
        let _ = write!(self.line, "{value}");
        let mut source = value.source();
        if source.is_some() {
            let _ = write!(self.line.0, " {}.sources=[", field.name());
        }
        while let Some(cause) = source {
            let _ = write!(self.line, "{cause}");
            source = cause.source();
            self.line
                .0
                .push_str(if source.is_some() { ", " } else { "]" });
        }
    }
}

/// Appends to a line with its control characters escaped: a newline, a carriage return or a
/// terminal escape in a value stays inside the line it belongs to.
struct Escaped<'a>(&'a mut String);

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '\n' => self.0.push_str("\\n"),
                '\r' => self.0.push_str("\\r"),
                c if c.is_control() => {
                    let _ = write!(self.0, "\\u{{{:x}}}", c as u32);
                }
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

/// A time as UTC to the microsecond, `2026-11-30T11:51:55.688967Z`.
struct Utc(SystemTime);

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A clock before 1970 is a broken clock: its lines read as 1970.
        let since = self.0.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        let (year, month, day) = civil_date(secs / 86_400);
        let of_day = secs % 86_400;
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
            of_day / 3600,
            of_day / 60 % 60,
            of_day % 60,
            since.subsec_micros()
        )
    }
}

/// The proleptic Gregorian date `days` after 1970-01-01: the days are counted in 400-year eras
/// from 0000-03-01, so that each year's leap day falls at its end.
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let of_era = z % 146_097;
    let year_of_era = (of_era - of_era / 1460 + of_era / 36_524 - of_era / 146_096) / 365;
    let of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * of_year + 2) / 153;
    let day = of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// What a subscriber wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl Write for Written {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Written {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn logged(max: Level, time: bool, events: impl FnOnce()) -> String {
        let written = Written::default();
        tracing::subscriber::with_default(Lines::new(max, time, written.clone()), events);
        written.text()
    }

    #[test]
    fn a_line_has_the_level_target_message_and_fields_as_fmt_writes_them() {
        let text = logged(Level::INFO, false, || {
            let outcome = Some(3);
            tracing::info!(stage = ?outcome, id = %"ab-1", us = 17, "hook finished");
            tracing::warn!(path = "/a b", "skipped");
            tracing::error!("failed");
            tracing::debug!("not at info");
        });
        assert_eq!(
            text,
            " INFO nvhook::log_line::tests: hook finished stage=Some(3) id=ab-1 us=17\n\
             \x20WARN nvhook::log_line::tests: skipped path=\"/a b\"\n\
             ERROR nvhook::log_line::tests: failed\n"
        );
    }

    #[test]
    fn an_error_field_lists_its_sources() {
        let io = std::io::Error::other("disk gone");
        let error = crate::config::ConfigError::Read {
            path: "/etc/nvhook/config.toml".into(),
            source: io,
        };
        let text = logged(Level::INFO, false, || {
            tracing::error!(error = &error as &dyn std::error::Error, "no config");
        });
        assert_eq!(
            text,
            format!(
                "ERROR nvhook::log_line::tests: no config error={error} error.sources=[disk gone]\n"
            )
        );
    }

    #[test]
    fn control_characters_from_a_value_stay_inside_its_line() {
        let planted = "lib.so\n2026-01-01T00:00:00.000000Z ERROR forged\r\x1b[2J";
        let text = logged(Level::INFO, false, || {
            tracing::info!(path = %planted, "{planted}");
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        assert!(text.contains("lib.so\\n2026-01-01"), "{text}");
        assert!(text.contains("\\u{1b}[2J"), "{text}");
    }

    #[test]
    fn a_line_starts_with_its_time_in_utc_to_the_microsecond() {
        let at = |secs: u64, micros: u64| {
            Utc(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros)).to_string()
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000005Z");
        assert_eq!(at(1_796_039_515, 688_967), "2026-11-30T11:51:55.688967Z");
        assert_eq!(at(4_107_542_399, 999_999), "2100-02-28T23:59:59.999999Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z");
        let text = logged(Level::INFO, true, || tracing::info!("now"));
        let (time, rest) = text.split_once(' ').unwrap();
        assert_eq!(time.len(), "2026-11-30T11:51:55.688967Z".len(), "{text}");
        assert!(time.ends_with('Z') && rest.starts_with(" INFO "), "{text}");
    }
}
