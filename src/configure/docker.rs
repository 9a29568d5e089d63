//! Docker's daemon.json: `runtimes.<name>.path`, and `default-runtime`.

use super::{Change, Invalid};
use serde::Serialize;
use serde_json::ser::PrettyFormatter;
use serde_json::{Map, Value};

/// The indent of Docker's documented daemon.json examples, for files that show none.
const DEFAULT_INDENT: &str = "    ";

pub(super) fn apply(current: Option<&str>, change: &Change) -> Result<Option<String>, Invalid> {
    let text = current.unwrap_or("");
    let before = parse(text)?;
    let mut after = before.clone();
    match *change {
        Change::Add {
            name,
            path,
            set_as_default,
        } => add(&mut after, name, path, set_as_default)?,
        Change::Remove { name } => remove(&mut after, name),
        Change::Nri { .. } => unreachable!("Engine::apply takes NRI changes"),
    }
    if after == before {
        // Re-serializing would normalize the user's formatting for no reason.
        return Ok(current.map(str::to_owned));
    }
    if after.is_empty() {
        // Docker reads a missing daemon.json as `{}`: give back the file's absence.
        return Ok(None);
    }
    Ok(Some(render(&after, text)))
}

/// The program runtime `name` runs in `current`, where it has one.
pub(super) fn runtime_program(current: &str, name: &str) -> Option<String> {
    let config = parse(current).ok()?;
    let path = config.get("runtimes")?.get(name)?.get("path")?;
    path.as_str().map(str::to_owned)
}

fn parse(text: &str) -> Result<Map<String, Value>, Invalid> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Invalid("not a JSON object at the top level".into())),
        Err(e) => Err(Invalid(format!("not valid JSON: {e}"))),
    }
}

fn add(
    config: &mut Map<String, Value>,
    name: &str,
    path: &str,
    set_as_default: bool,
) -> Result<(), Invalid> {
    let runtimes = config
        .entry("runtimes")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| Invalid("`runtimes` is not an object".into()))?;
    let runtime = runtimes
        .entry(name)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| Invalid(format!("`runtimes.{name}` is not an object")))?;
    // Other keys of an existing entry (runtimeArgs) are the user's: only the path is ours.
    runtime.insert("path".into(), path.into());
    if set_as_default {
        config.insert("default-runtime".into(), name.into());
    }
    Ok(())
}

/// `shift_remove`, not `remove`: with preserve_order the latter moves the last key into the
/// hole, reordering the user's file.
fn remove(config: &mut Map<String, Value>, name: &str) {
    if let Some(Value::Object(runtimes)) = config.get_mut("runtimes")
        && runtimes.shift_remove(name).is_some()
        && runtimes.is_empty()
    {
        config.shift_remove("runtimes");
    }
    if config.get("default-runtime").and_then(Value::as_str) == Some(name) {
        config.shift_remove("default-runtime");
    }
}

/// Pretty-prints with the file's own indent and final newline, so that the lines configure
/// did not touch stay as they were.
fn render(config: &Map<String, Value>, original: &str) -> String {
    let indent = original
        .lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty())
        .map(|line| &line[..line.len() - line.trim_start().len()])
        .find(|ws| !ws.is_empty())
        .unwrap_or(DEFAULT_INDENT);
    let mut out = Vec::new();
    let formatter = PrettyFormatter::with_indent(indent.as_bytes());
    config
        .serialize(&mut serde_json::Serializer::with_formatter(
            &mut out, formatter,
        ))
        .expect("a JSON map always serializes into memory");
    let mut text = String::from_utf8(out).expect("serde_json writes UTF-8");
    if original.is_empty() || original.ends_with('\n') {
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::configure::test_changes::{ADD, REMOVE};

    #[test]
    fn new_file_uses_four_spaces() {
        let out = apply(None, &ADD).unwrap().unwrap();
        let expected = "{\n    \"runtimes\": {\n        \"nvidia\": {\n            \"path\": \"/usr/bin/nvhook-runtime\"\n        }\n    }\n}\n";
        assert_eq!(out, expected);
    }

    #[test]
    fn keeps_the_files_indent_and_key_order_through_add_and_remove() {
        let text = "{\n  \"log-driver\": \"journald\",\n  \"runtimes\": {\n    \"kata\": {\n      \"path\": \"/usr/bin/kata\"\n    }\n  },\n  \"data-root\": \"/srv/docker\"\n}\n";
        let added = apply(Some(text), &ADD).unwrap().unwrap();
        assert!(added.starts_with("{\n  \"log-driver\""), "{added}");
        assert!(
            added.ends_with("  \"data-root\": \"/srv/docker\"\n}\n"),
            "{added}"
        );
        assert_eq!(apply(Some(&added), &REMOVE).unwrap().as_deref(), Some(text));
    }

    #[test]
    fn keeps_runtime_args_of_an_existing_entry() {
        let text = r#"{"runtimes": {"nvidia": {"path": "/old", "runtimeArgs": ["--debug"]}}}"#;
        let out = apply(Some(text), &ADD).unwrap().unwrap();
        let value: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(value["runtimes"]["nvidia"]["runtimeArgs"][0], "--debug");
        assert_eq!(
            value["runtimes"]["nvidia"]["path"],
            "/usr/bin/nvhook-runtime"
        );
    }

    #[test]
    fn unchanged_text_is_returned_as_is() {
        let text = "{\"runtimes\":{\"nvidia\":{\"path\":\"/usr/bin/nvhook-runtime\"}}}";
        assert_eq!(apply(Some(text), &ADD).unwrap().as_deref(), Some(text));
    }

    #[test]
    fn remove_keeps_a_default_runtime_that_is_not_ours() {
        let text = "{\n    \"default-runtime\": \"crun\"\n}\n";
        let added = apply(Some(text), &ADD).unwrap().unwrap();
        assert_eq!(apply(Some(&added), &REMOVE).unwrap().as_deref(), Some(text));
    }

    #[test]
    fn wrong_shapes_are_refused() {
        let Invalid(message) = apply(Some("[]"), &ADD).unwrap_err();
        assert_eq!(message, "not a JSON object at the top level");
        let Invalid(message) = apply(Some(r#"{"runtimes": 1}"#), &ADD).unwrap_err();
        assert_eq!(message, "`runtimes` is not an object");
    }
}
