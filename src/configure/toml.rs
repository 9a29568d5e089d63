//! Format-preserving TOML edits shared by the containerd and CRI-O engines.

use super::Invalid;
use toml_edit::{DocumentMut, Item, Table, TableLike, Value};

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
        Invalid(format!("not valid TOML{at}: {}", e.message().trim()))
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
/// its spacing and trailing comment, so that re-running configure changes no byte.
pub(super) fn set_str(table: &mut dyn TableLike, key: &str, value: &str) {
    let old_decor = match table.get(key).and_then(Item::as_value) {
        Some(old) if old.as_str() == Some(value) => return,
        Some(old) => Some(old.decor().clone()),
        None => None,
    };
    let mut new = Value::from(value);
    if let Some(decor) = old_decor {
        *new.decor_mut() = decor;
    }
    table.insert(key, Item::Value(new));
}

/// Removes `key` from `table` when it is the string `value`; a different value is the
/// user's and stays.
pub(super) fn remove_str_if(table: &mut Table, key: &str, value: &str) {
    if table.get(key).and_then(Item::as_str) == Some(value) {
        table.remove(key);
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
fn is_blank(table: &Table) -> bool {
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
    fn remove_str_if_leaves_other_values() {
        let mut doc: DocumentMut = "k = \"theirs\"\n".parse().unwrap();
        remove_str_if(doc.as_table_mut(), "k", "ours");
        assert_eq!(doc.to_string(), "k = \"theirs\"\n");
        remove_str_if(doc.as_table_mut(), "k", "theirs");
        assert_eq!(doc.to_string(), "");
    }
}
