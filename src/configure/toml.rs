//! Format-preserving TOML edits shared by the containerd and CRI-O engines.

use super::Invalid;
use toml_edit::{DocumentMut, Item, Key, Table, TableLike, Value};

/// Parses an engine's TOML config; a missing file is an empty document.
pub(super) fn parse(current: Option<&str>) -> Result<DocumentMut, Invalid> {
    let text = current.unwrap_or("");
    text.parse::<DocumentMut>().map_err(|e| {
        // toml_edit's own message spans several lines with a source excerpt; keep one.
        let at = e.span().map_or(String::new(), |span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!(" at line {line}, column {column}")
        });
        let message = e.message().trim().replace('\n', ", ");
        Invalid(format!("not valid TOML{at}: {message}"))
    })
}

/// The table at `path`, created where missing. Created levels are implicit: they print no
/// header of their own, and vanish again once empty, which is what makes `--remove` exact.
pub(super) fn table_mut<'a>(root: &'a mut Table, path: &[&str]) -> Result<&'a mut Table, Invalid> {
    let mut table = root;
    for (depth, key) in path.iter().enumerate() {
        let item = table.entry(key).or_insert_with(|| {
            let mut new = Table::new();
            new.set_implicit(true);
            Item::Table(new)
        });
        table = item
            .as_table_mut()
            .ok_or_else(|| not_a_table(&path[..=depth]))?;
    }
    Ok(table)
}

/// The table at `path`, if every level of it exists as a table.
pub(super) fn existing_table_mut<'a>(root: &'a mut Table, path: &[&str]) -> Option<&'a mut Table> {
    path.iter()
        .try_fold(root, |table, key| table.get_mut(key)?.as_table_mut())
}

/// The table (or inline table) under `key`, created as a standard table where missing.
pub(super) fn table_like_mut<'a>(
    parent: &'a mut dyn TableLike,
    key: &str,
    path_for_errors: &[&str],
) -> Result<&'a mut dyn TableLike, Invalid> {
    if parent.get(key).is_none() {
        parent.insert(key, Item::Table(Table::new()));
    }
    parent
        .get_mut(key)
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| not_a_table(path_for_errors))
}

fn not_a_table(path: &[&str]) -> Invalid {
    Invalid(format!("`{}` is not a table", dotted(path)))
}

/// `path` as TOML writes it, quoting the keys that need it.
pub(super) fn dotted(path: &[&str]) -> String {
    path.iter()
        .map(|key| toml_edit::Key::new(*key).display_repr().into_owned())
        .collect::<Vec<_>>()
        .join(".")
}

/// Sets `key` to the string `value`. An equal value is left alone, and a replaced one keeps
/// its key's indentation and its trailing comment, so that re-running configure changes no
/// byte. A new key is indented like its siblings.
pub(super) fn set_str(table: &mut dyn TableLike, key: &str, value: &str) {
    match table.get_mut(key) {
        Some(Item::Value(old)) if old.as_str() == Some(value) => {}
        Some(Item::Value(old)) => {
            let literal = old.clone().decorated("", "").to_string().starts_with('\'');
            replace_keeping_decor(old, string_like(value, literal));
        }
        _ => insert_like_siblings(table, key, Value::from(value)),
    }
}

/// Sets `key` to the boolean `value`, with the same care for the file's bytes as `set_str`.
pub(super) fn set_bool(table: &mut dyn TableLike, key: &str, value: bool) {
    match table.get_mut(key) {
        Some(Item::Value(old)) if old.as_bool() == Some(value) => {}
        Some(Item::Value(old)) => replace_keeping_decor(old, Value::from(value)),
        _ => insert_like_siblings(table, key, Value::from(value)),
    }
}

fn replace_keeping_decor(old: &mut Value, new: Value) {
    let decor = old.decor().clone();
    *old = new;
    *old.decor_mut() = decor;
}

/// Adds `key` (replacing a non-value of that name), indented like the table's first value.
fn insert_like_siblings(table: &mut dyn TableLike, key: &str, value: Value) {
    let mut new_key = Key::new(key);
    let sibling = table
        .iter()
        .find(|(_, item)| item.is_value())
        .map(|(k, _)| k);
    if let Some(prefix) = sibling
        .and_then(|k| table.key(k))
        .and_then(|k| k.leaf_decor().prefix()?.as_str())
    {
        new_key
            .leaf_decor_mut()
            .set_prefix(last_line(prefix).to_owned());
    }
    table.remove(key);
    table.entry_format(&new_key).or_insert(Item::Value(value));
}

/// `value` as a TOML string, in 'literal' quotes when the file used them there (containerd
/// 2 writes all its strings that way) and the value allows it.
fn string_like(value: &str, literal: bool) -> Value {
    let basic = || Value::from(value);
    if !literal || value.contains(['\'', '\n', '\r']) {
        return basic();
    }
    format!("'{value}'").parse().unwrap_or_else(|_| basic())
}

/// The part of a decor prefix on the item's own line: its indentation (comment lines and
/// blank lines above belong to the original item, not to a copy or a sibling).
fn last_line(prefix: &str) -> &str {
    &prefix[prefix.rfind('\n').map_or(0, |i| i + 1)..]
}

/// The comment that records the value `set_default` or `set_noted` replaced.
const WAS: &str = " # nvhook: was ";
/// What `set_noted` records for a key that was not there.
const UNSET: &str = "unset";

/// The trailing comment that records `old`, after the comment it had.
fn was_note(old: &Value) -> String {
    let bare = old.clone().decorated("", "").to_string();
    let suffix = old.decor().suffix().and_then(|s| s.as_str()).unwrap_or("");
    format!("{suffix}{WAS}{bare}")
}

/// What a note of [`was_note`] (or `set_noted`'s for a new key) on `value` records.
enum Noted {
    /// The value it replaced, decorated as it was.
    Value(Value),
    /// The key was not there.
    Unset,
}

fn noted(value: &Value) -> Option<Noted> {
    let suffix = value.decor().suffix().and_then(|s| s.as_str())?;
    let (kept, was) = suffix.split_once(WAS)?;
    if was.trim() == UNSET {
        return Some(Noted::Unset);
    }
    let old = was.trim().parse::<Value>().ok()?;
    Some(Noted::Value(old.decorated(
        value.decor().prefix().cloned().unwrap_or_default(),
        kept,
    )))
}

/// Makes `key` name our runtime. A value it replaces is kept in a trailing comment, so
/// that `unset_default` can put it back byte for byte.
pub(super) fn set_default(table: &mut Table, key: &str, name: &str) {
    let note = match table.get(key).and_then(Item::as_value) {
        Some(old) if old.as_str() == Some(name) => return,
        Some(old) => Some(was_note(old)),
        None => None,
    };
    set_str(table, key, name);
    if let (Some(note), Some(value)) = (note, table.get_mut(key).and_then(Item::as_value_mut)) {
        value.decor_mut().set_suffix(note);
    }
}

/// Undoes `set_default` when `key` still names our runtime; another value is the user's.
pub(super) fn unset_default(table: &mut Table, key: &str, name: &str) {
    let Some(value) = table.get_mut(key).and_then(Item::as_value_mut) else {
        return;
    };
    if value.as_str() != Some(name) {
        return;
    }
    match noted(value) {
        Some(Noted::Value(old)) => *value = old,
        _ => {
            table.remove(key);
        }
    }
}

/// Sets `key` to the boolean `value`, noting in a trailing comment what was there (`# nvhook:
/// was true`, `# nvhook: was unset`), so that `unset_noted` gives it back byte for byte. An
/// equal value is left alone, and stays the user's.
pub(super) fn set_noted(table: &mut Table, key: &str, value: bool) {
    let note = match table.get(key).and_then(Item::as_value) {
        Some(old) if old.as_bool() == Some(value) => return,
        Some(old) => was_note(old),
        None => format!("{WAS}{UNSET}"),
    };
    set_bool(table, key, value);
    if let Some(value) = table.get_mut(key).and_then(Item::as_value_mut) {
        value.decor_mut().set_suffix(note);
    }
}

/// Undoes `set_noted`: a value without its note is the user's and stays.
pub(super) fn unset_noted(table: &mut Table, key: &str) {
    let Some(value) = table.get_mut(key).and_then(Item::as_value_mut) else {
        return;
    };
    match noted(value) {
        Some(Noted::Value(old)) => *value = old,
        Some(Noted::Unset) => {
            table.remove(key);
        }
        None => {}
    }
}

/// Runs `removal` on the document, then hides the tables along `path` that it left empty.
/// A header that configure wrote is explicit once the file is read back; without this,
/// `--remove` would leave it behind, empty. Tables that were already empty, or that carry
/// a comment, are the user's and stay.
pub(super) fn remove_tidily(root: &mut Table, path: &[&str], removal: impl FnOnce(&mut Table)) {
    let levels = 1..path.len() + 1;
    let had_content: Vec<bool> = levels
        .clone()
        .map(|depth| existing_table_mut(root, &path[..depth]).is_some_and(|t| !is_blank(t)))
        .collect();
    removal(root);
    for (depth, had_content) in levels.zip(had_content).rev() {
        if let Some(table) = existing_table_mut(root, &path[..depth])
            && had_content
            && is_blank(table)
            && !has_comment(table)
        {
            table.set_implicit(true);
        }
    }
}

/// Whether `table` prints nothing but empty headers.
pub(super) fn is_blank(table: &Table) -> bool {
    table
        .iter()
        .all(|(_, item)| item.as_table().is_some_and(is_blank))
}

fn has_comment(table: &Table) -> bool {
    let decor = table.decor();
    [decor.prefix(), decor.suffix()]
        .into_iter()
        .flatten()
        .any(|raw| raw.as_str().is_some_and(|s| s.contains('#')))
}

/// A copy of `item` that can live elsewhere in the document: a standard table keeps its
/// parsed position otherwise, and would be printed at its original's place. The comment
/// above the original describes the original, so the copy keeps only its indentation.
pub(super) fn relocatable(item: &Item) -> Item {
    fn forget_positions(table: &mut Table) {
        table.set_position(None);
        for (_, child) in table.iter_mut() {
            if let Item::Table(child) = child {
                forget_positions(child);
            }
        }
    }
    let mut copy = item.clone();
    if let Item::Table(table) = &mut copy {
        forget_positions(table);
        // What follows the last newline is the header line's indentation (only blanks).
        let prefix = table
            .decor()
            .prefix()
            .and_then(|p| p.as_str())
            .unwrap_or("");
        let blank_line_then_indent =
            format!("\n{}", &prefix[prefix.rfind('\n').map_or(0, |i| i + 1)..]);
        table.decor_mut().set_prefix(blank_line_then_indent);
    }
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_error_is_one_line_with_its_position() {
        let Invalid(message) = parse(Some("a = 1\nb = = 2\n")).unwrap_err();
        assert!(!message.contains('\n'), "{message}");
        assert!(
            message.starts_with("not valid TOML at line 2, column "),
            "{message}"
        );
    }

    #[test]
    fn created_levels_print_no_header() {
        let mut doc = DocumentMut::new();
        let t = table_mut(doc.as_table_mut(), &["a", "b.c", "d"]).unwrap();
        t.insert("k", toml_edit::value("v"));
        assert_eq!(doc.to_string(), "[a.\"b.c\".d]\nk = \"v\"\n");
    }

    #[test]
    fn a_non_table_on_the_way_is_named() {
        let mut doc: DocumentMut = "[a]\nb = 1\n".parse().unwrap();
        let Invalid(message) = table_mut(doc.as_table_mut(), &["a", "b", "c"]).unwrap_err();
        assert_eq!(message, "`a.b` is not a table");
    }

    #[test]
    fn set_str_keeps_the_comment_of_the_value_it_replaces() {
        let mut doc: DocumentMut = "k = \"old\"  # why\n".parse().unwrap();
        set_str(doc.as_table_mut(), "k", "new");
        assert_eq!(doc.to_string(), "k = \"new\"  # why\n");
    }

    #[test]
    fn set_str_keeps_literal_quotes() {
        let mut doc: DocumentMut = "a = ''\nb = 'x'\n".parse().unwrap();
        set_str(doc.as_table_mut(), "a", "/usr/bin/nvhook-runtime");
        set_str(doc.as_table_mut(), "b", "it's");
        assert_eq!(
            doc.to_string(),
            "a = '/usr/bin/nvhook-runtime'\nb = \"it's\"\n"
        );
    }

    #[test]
    fn set_str_indents_a_new_key_like_its_siblings() {
        let mut doc: DocumentMut = "[t]\n  # about a\n  a = 1\n".parse().unwrap();
        set_str(doc["t"].as_table_mut().unwrap(), "b", "x");
        assert_eq!(doc.to_string(), "[t]\n  # about a\n  a = 1\n  b = \"x\"\n");
    }

    #[test]
    fn set_bool_keeps_the_comment_and_leaves_an_equal_value_alone() {
        let text = "a = true  # why\nb = false # same\n";
        let mut doc: DocumentMut = text.parse().unwrap();
        set_bool(doc.as_table_mut(), "a", false);
        set_bool(doc.as_table_mut(), "b", false);
        set_bool(doc.as_table_mut(), "c", true);
        assert_eq!(
            doc.to_string(),
            "a = false  # why\nb = false # same\nc = true\n"
        );
    }

    #[test]
    fn unset_default_puts_back_what_set_default_replaced() {
        let text = "[c]\n  default = 'crun'  # ours\n";
        let mut doc: DocumentMut = text.parse().unwrap();
        let table = doc["c"].as_table_mut().unwrap();
        set_default(table, "default", "nvidia");
        assert_eq!(
            doc.to_string(),
            "[c]\n  default = 'nvidia'  # ours # nvhook: was 'crun'\n"
        );
        unset_default(doc["c"].as_table_mut().unwrap(), "default", "nvidia");
        assert_eq!(doc.to_string(), text);
    }

    #[test]
    fn unset_default_removes_a_default_it_added_and_keeps_others() {
        let mut doc: DocumentMut = "[c]\n".parse().unwrap();
        set_default(doc["c"].as_table_mut().unwrap(), "default", "nvidia");
        unset_default(doc["c"].as_table_mut().unwrap(), "default", "other");
        assert_eq!(doc.to_string(), "[c]\ndefault = \"nvidia\"\n");
        unset_default(doc["c"].as_table_mut().unwrap(), "default", "nvidia");
        assert_eq!(doc.to_string(), "[c]\n");
    }

    #[test]
    fn unset_noted_gives_back_what_set_noted_changed_and_only_that() {
        for text in ["[t]\n  disable = true  # off here\n", "[t]\n  other = 1\n"] {
            let mut doc: DocumentMut = text.parse().unwrap();
            set_noted(doc["t"].as_table_mut().unwrap(), "disable", false);
            assert!(doc.to_string().contains("disable = false"), "{doc}");
            assert!(doc.to_string().contains("# nvhook: was "), "{doc}");
            unset_noted(doc["t"].as_table_mut().unwrap(), "disable");
            assert_eq!(doc.to_string(), text);
        }
        // The user's own `false`: left alone both ways.
        let text = "[t]\ndisable = false\n";
        let mut doc: DocumentMut = text.parse().unwrap();
        set_noted(doc["t"].as_table_mut().unwrap(), "disable", false);
        unset_noted(doc["t"].as_table_mut().unwrap(), "disable");
        assert_eq!(doc.to_string(), text);
    }
}
