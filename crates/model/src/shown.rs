//! Values from the container, as nvhook's messages show them.
//!
//! An error names the value it refuses, so that the image's author sees which one. That value
//! was written by whoever built the image or the pod: shown as it is, a newline in it adds a
//! line to runc's error, the engine's events and nvhook's log, and a 100 KB variable makes a
//! 100 KB line on every retry of a crash-looping pod. Every error field and log field that
//! holds such a value (an environment variable's name or value, a part of one, a mount
//! destination, a link target or file name in the image) is an [`Shown`], so that SECURITY.md's
//! promise, one line of at most 400 characters, holds whatever the container says.

use std::fmt::{self, Write};

/// The most of a value a message shows, in bytes of its escaped form: enough to recognise
/// the value, and few enough that a line naming three values (a variable, the part of it that
/// is refused, and a part of that) stays within 400 characters.
pub const SHOWN_BYTES: usize = 64;

/// A host path a runtime or a command line gave nvhook (a bundle, a rootfs), as messages show
/// it: whole, with control characters escaped, so that it stays on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownPath<'a>(pub &'a std::path::Path);

impl fmt::Display for ShownPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.to_string_lossy().chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_debug())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// A value the container supplied. Displayed escaped (`\n`, `\u{1b}`, `\"`: one line, no
/// terminal control) and cut after [`SHOWN_BYTES`], whole escapes and characters only, with
/// the value's length: `GPU-aaaa… (100000 bytes)`. Equality is the value's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shown<S = String>(pub S);

impl From<&str> for Shown {
    fn from(value: &str) -> Shown {
        Shown(value.to_string())
    }
}

impl From<String> for Shown {
    fn from(value: String) -> Shown {
        Shown(value)
    }
}

impl<S: AsRef<str>> fmt::Display for Shown<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.0.as_ref();
        let mut shown = String::with_capacity(SHOWN_BYTES + 16);
        for c in value.chars() {
            let before = shown.len();
            write!(shown, "{}", c.escape_debug())?;
            if shown.len() > SHOWN_BYTES {
                shown.truncate(before);
                return write!(f, "{shown}… ({} bytes)", value.len());
            }
        }
        f.write_str(&shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_shown_whole_and_escaped() {
        assert_eq!(Shown("0,1").to_string(), "0,1");
        assert_eq!(Shown("").to_string(), "");
        assert_eq!(
            Shown("GPU-\n\u{1b}[31m\"red\"\t\\").to_string(),
            "GPU-\\n\\u{1b}[31m\\\"red\\\"\\t\\\\"
        );
        let exact = "x".repeat(SHOWN_BYTES);
        assert_eq!(Shown(exact.as_str()).to_string(), exact);
    }

    #[test]
    fn long_values_keep_their_start_and_say_how_long_they_were() {
        let value = "a".repeat(100_000);
        assert_eq!(
            Shown(&value).to_string(),
            format!("{}… (100000 bytes)", "a".repeat(SHOWN_BYTES))
        );
        let one_over = "b".repeat(SHOWN_BYTES + 1);
        assert_eq!(
            Shown(&one_over).to_string(),
            format!("{}… (65 bytes)", "b".repeat(SHOWN_BYTES))
        );
    }

    #[test]
    fn a_path_is_shown_whole_on_one_line() {
        let long = format!("/run/{}/bundle\nrootfs\u{1b}[2J", "x".repeat(200));
        let shown = ShownPath(std::path::Path::new(&long)).to_string();
        assert!(
            !shown.contains('\n') && !shown.contains('\u{1b}'),
            "{shown}"
        );
        assert!(shown.ends_with("/bundle\\nrootfs\\u{1b}[2J"), "{shown}");
        assert!(shown.contains(&"x".repeat(200)));
    }

    #[test]
    fn the_cut_never_splits_an_escape_or_a_character() {
        // 63 bytes, then an escape of 6: the escape is left out whole.
        let value = format!("{}\u{1}tail", "c".repeat(SHOWN_BYTES - 1));
        assert_eq!(
            Shown(&value).to_string(),
            format!("{}… ({} bytes)", "c".repeat(SHOWN_BYTES - 1), value.len())
        );
        // Three-byte characters: 21 of them fit in 64 bytes.
        let value = "€".repeat(100);
        assert_eq!(
            Shown(&value).to_string(),
            format!("{}… (300 bytes)", "€".repeat(21))
        );
        // Control characters count as their escapes: never more than 64 bytes of them.
        let value = "\u{7}".repeat(100_000);
        let shown = Shown(&value).to_string();
        assert_eq!(shown, format!("{}… (100000 bytes)", "\\u{7}".repeat(12)));
    }
}
