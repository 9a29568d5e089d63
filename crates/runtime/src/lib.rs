//! What nvhook-runtime decides on raw bytes, before there is any reason to start nvhook.
//!
//! Engines run nvhook-runtime for every command of every container (create, start, state,
//! kill, delete, ...), GPU or not, and only `create`/`run` of a container that asks for a GPU
//! needs nvhook's create path. So nvhook-runtime is a libc-free static program built on this module
//! (`core` only) that hands everything else straight to runc: a dynamic std binary would add
//! its loader, relocations and libc and std start-up to every command it passes on (the
//! figures are in docs/performance.md).
//!
//! Every answer here is either certain or "ask nvhook": the full create path (`nvhook runtime`) is
//! always right, this module only spares it where the bytes leave no doubt.

#![no_std]

pub mod server;

/// runc's global flags that take a value (`--root DIR`); the others are booleans.
const GLOBAL_FLAGS_WITH_VALUE: &[&[u8]] = &[
    b"--root",
    b"--log",
    b"--log-format",
    b"--criu",
    b"--rootless",
];

/// The runtimes nvhook-runtime tries when its config names none.
pub const DEFAULT_RUNTIMES: [&str; 2] = ["runc", "crun"];

/// Where runtimes are looked for when PATH is unset.
pub const DEFAULT_SEARCH_PATH: &[u8] =
    b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `nvhook runtime RUNC-ARGS` is the full create path that nvhook-runtime hands a GPU create to.
pub const CREATE_SUBCOMMAND: &str = "runtime";

/// The variable that names nvhook's config file.
pub const CONFIG_ENV: &str = "NVHOOK_CONFIG";

/// The nvhook config read when NVHOOK_CONFIG names none.
pub const DEFAULT_CONFIG: &str = "/etc/nvhook/config.toml";

/// Byte strings without which a config.json cannot ask for a GPU (see `Request::decide`):
/// the variable that lists devices, a legacy image's CUDA_VERSION, the device plugin's
/// mount directory, and JSON's `\u` escape, which could spell any of them. Other escapes
/// (`\/`, `\n`, ...) cannot produce a letter, `_` or `-`.
const GPU_MARKERS: [&[u8]; 4] = [
    b"NVIDIA_VISIBLE_DEVICES",
    b"CUDA_VERSION",
    b"nvidia-container-devices",
    b"\\u",
];

/// What the runtime is asked to do, as far as nvhook-runtime cares.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation<'a> {
    pub command: Option<&'a [u8]>,
    pub bundle: Option<&'a [u8]>,
}

impl<'a> Invocation<'a> {
    /// Reads runc's command line (without argv[0]): global flags, the command, its flags.
    pub fn parse<I: IntoIterator<Item = &'a [u8]>>(args: I) -> Invocation<'a> {
        let mut it = args.into_iter();
        let command = loop {
            match it.next() {
                None => return Invocation::default(),
                Some(flag) if flag.first() == Some(&b'-') => {
                    if GLOBAL_FLAGS_WITH_VALUE.contains(&flag) {
                        it.next();
                    }
                }
                Some(command) => break command,
            }
        };
        let mut bundle = None;
        while let Some(a) = it.next() {
            if a == b"--bundle" || a == b"-b" {
                bundle = it.next();
                break;
            }
            if let Some(v) = a
                .strip_prefix(b"--bundle=")
                .or_else(|| a.strip_prefix(b"-b="))
            {
                bundle = Some(v);
                break;
            }
        }
        Invocation {
            command: Some(command),
            bundle,
        }
    }

    /// Whether this command creates a container from a bundle.
    pub fn creates(&self) -> bool {
        matches!(self.command, Some(b"create" | b"run"))
    }
}

/// False only when `config_json` certainly asks for no GPU, whatever nvhook's config says.
pub fn may_ask_for_gpu(config_json: &[u8]) -> bool {
    config_json.iter().enumerate().any(|(i, &b)| {
        GPU_MARKERS
            .iter()
            .any(|m| m[0] == b && config_json[i..].starts_with(m))
    })
}

/// The `runtimes` key of an nvhook config, as far as a line scanner can be sure of it.
#[derive(Debug, PartialEq, Eq)]
pub enum Runtimes<'a> {
    /// No top-level `runtimes` key: [`DEFAULT_RUNTIMES`].
    Default,
    /// The inside of a one-line array of plain strings: iterate with [`array_strings`].
    Listed(&'a [u8]),
    /// Anything else (multi-line strings, quoted keys, escapes, ...): ask nvhook.
    Unsure,
}

/// Finds the top-level `runtimes` array in a TOML document without parsing the rest of it:
/// values of other keys are skipped with their brackets and strings tracked, and anything
/// a plain scan could misread makes the answer [`Runtimes::Unsure`].
pub fn runtimes_in_toml(text: &[u8]) -> Runtimes<'_> {
    match top_level_key(text, b"runtimes") {
        Key::Absent => Runtimes::Default,
        Key::At(key_end) => runtimes_value(text, key_end),
        Key::Unsure => Runtimes::Unsure,
    }
}

/// The config's `runtime-server` key, as far as a line scanner can be sure of it.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerSocket<'a> {
    /// No top-level key: [`server::DEFAULT_SOCKET`].
    Default,
    /// A one-line string without escapes; empty turns the server off.
    Named(&'a [u8]),
    /// Anything else: nvhook reads the config (the create is handed to it).
    Unsure,
}

/// Finds the top-level `runtime-server` string, as [`runtimes_in_toml`] finds `runtimes`.
pub fn server_socket_in_toml(text: &[u8]) -> ServerSocket<'_> {
    match top_level_key(text, server::SOCKET_KEY.as_bytes()) {
        Key::Absent => ServerSocket::Default,
        Key::At(key_end) => {
            let i = skip_blanks(text, key_end);
            if text.get(i) != Some(&b'=') {
                return ServerSocket::Unsure;
            }
            match quoted(text, skip_blanks(text, i + 1)) {
                Some((value, next)) if ends_line(text, next) => ServerSocket::Named(value),
                _ => ServerSocket::Unsure,
            }
        }
        Key::Unsure => ServerSocket::Unsure,
    }
}

/// Where a top-level key is in a TOML document.
enum Key {
    /// Not before the first table header (or the end).
    Absent,
    /// Just after the key's name.
    At(usize),
    /// Something a plain scan could misread came first.
    Unsure,
}

fn top_level_key(text: &[u8], key: &[u8]) -> Key {
    let mut i = 0;
    while i < text.len() {
        i = skip_blanks(text, i);
        match text.get(i) {
            None => break,
            Some(b'\n' | b'\r') => i += 1,
            Some(b'#') => i = line_end(text, i),
            // The first table header ends the top level.
            Some(b'[') => return Key::Absent,
            Some(&c) if is_bare_key_char(c) => {
                let key_end = i + text[i..]
                    .iter()
                    .take_while(|&&c| is_bare_key_char(c))
                    .count();
                if &text[i..key_end] == key {
                    return Key::At(key_end);
                }
                match skip_value(text, key_end) {
                    Some(next) => i = next,
                    None => return Key::Unsure,
                }
            }
            // A quoted key (it could spell the one looked for), a byte-order mark, ...
            Some(_) => return Key::Unsure,
        }
    }
    Key::Absent
}

/// The strings of a [`Runtimes::Listed`] array (checked by [`runtimes_value`]: quoted
/// strings without escapes, commas and blanks).
pub fn array_strings(inner: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = inner;
    core::iter::from_fn(move || {
        let start = rest.iter().position(|&c| c == b'"' || c == b'\'')?;
        let quote = rest[start];
        let len = rest[start + 1..].iter().position(|&c| c == quote)?;
        let item = &rest[start + 1..start + 1 + len];
        rest = &rest[start + len + 2..];
        Some(item)
    })
}

fn is_bare_key_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

fn skip_blanks(text: &[u8], i: usize) -> usize {
    i + text[i..]
        .iter()
        .take_while(|&&c| c == b' ' || c == b'\t')
        .count()
}

fn line_end(text: &[u8], i: usize) -> usize {
    i + text[i..].iter().take_while(|&&c| c != b'\n').count()
}

/// `= [ "a", 'b' ]` after the key, all on one line: the inside of the brackets.
fn runtimes_value(text: &[u8], key_end: usize) -> Runtimes<'_> {
    let i = skip_blanks(text, key_end);
    if text.get(i) != Some(&b'=') {
        return Runtimes::Unsure;
    }
    let i = skip_blanks(text, i + 1);
    if text.get(i) != Some(&b'[') {
        return Runtimes::Unsure;
    }
    let start = i + 1;
    let mut j = start;
    loop {
        j = skip_blanks(text, j);
        match text.get(j) {
            Some(b']') => break,
            Some(b',') => j += 1,
            Some(b'"' | b'\'') => match quoted(text, j) {
                Some((_, next)) => j = next,
                None => return Runtimes::Unsure,
            },
            _ => return Runtimes::Unsure,
        }
    }
    if ends_line(text, j + 1) {
        Runtimes::Listed(&text[start..j])
    } else {
        Runtimes::Unsure
    }
}

/// A one-line quoted string at `i` without escapes (and not a multi-line string's `"""`):
/// its inside, and the index just past its closing quote.
fn quoted(text: &[u8], i: usize) -> Option<(&[u8], usize)> {
    let q = *text.get(i).filter(|&&c| c == b'"' || c == b'\'')?;
    let len = text[i + 1..]
        .iter()
        .take_while(|&&c| c != q && c != b'\\' && c != b'\n')
        .count();
    let triple = len == 0 && text.get(i + 2) == Some(&q);
    (text.get(i + 1 + len) == Some(&q) && !triple).then(|| (&text[i + 1..i + 1 + len], i + len + 2))
}

/// Whether only blanks and a comment are left of the line from `i`.
fn ends_line(text: &[u8], i: usize) -> bool {
    let rest = skip_blanks(text, i);
    match text.get(rest) {
        None | Some(b'\n' | b'#') => true,
        Some(b'\r') => text.get(rest + 1) == Some(&b'\n'),
        _ => false,
    }
}

/// From just after a key to the start of the next line at the top level, skipping the
/// value's strings, brackets and comments; `None` for what a scan cannot follow safely.
fn skip_value(text: &[u8], mut i: usize) -> Option<usize> {
    let mut depth = 0usize;
    while let Some(&c) = text.get(i) {
        match c {
            b'\n' if depth == 0 => return Some(i + 1),
            b'#' => i = line_end(text, i) - 1,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.checked_sub(1)?,
            b'"' | b'\'' => {
                // Multi-line strings may hold lines that look like keys.
                if text.get(i + 1..i + 3) == Some(&[c, c]) {
                    return None;
                }
                i += 1;
                while let Some(&s) = text.get(i) {
                    match s {
                        b'\\' if c == b'"' => {
                            // An escaped line end is a multi-line string's.
                            if matches!(text.get(i + 1), None | Some(b'\n' | b'\r')) {
                                return None;
                            }
                            i += 1;
                        }
                        b'\n' => return None,
                        _ if s == c => break,
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    (depth == 0).then_some(i)
}

/// `dir/name` into `buf` (just `name` for an empty PATH entry), as a NUL-terminated C string.
pub fn join_path<'b>(buf: &'b mut [u8], dir: &[u8], name: &[u8]) -> Option<&'b [u8]> {
    let sep = usize::from(!dir.is_empty());
    let len = dir.len() + sep + name.len();
    if len + 1 > buf.len() || name.contains(&0) || dir.contains(&0) {
        return None;
    }
    buf[..dir.len()].copy_from_slice(dir);
    if sep == 1 {
        buf[dir.len()] = b'/';
    }
    buf[dir.len() + sep..len].copy_from_slice(name);
    buf[len] = 0;
    Some(&buf[..=len])
}
