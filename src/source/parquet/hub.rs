//! The Hugging Face Hub's layout of a dataset: a folder with `data/<split>-*.parquet` (or
//! `data/<split>/*.parquet`), and the class names of a `ClassLabel` column, from the files'
//! own `huggingface` metadata (what `datasets` writes) or the README's `dataset_info` YAML.

use std::path::{Path, PathBuf};

use parquet::file::metadata::KeyValue;

/// The `.parquet` files of `split` under the dataset folder `root`'s `data/`, in sorted order;
/// `None` if `root` has no `data/` folder. The names of the splits found come back when none
/// is `split`.
pub(crate) fn split_files(root: &Path, split: &str) -> Option<Result<Vec<PathBuf>, Vec<String>>> {
    let data = root.join("data");
    if !data.is_dir() {
        return None;
    }
    let mut all = Vec::new();
    walk(&data, &mut all);
    all.sort();
    let split_of =
        |path: &Path| -> Option<String> { split_of(path.strip_prefix(&data).ok()?.to_str()?) };
    let mut splits: Vec<String> = all.iter().filter_map(|p| split_of(p)).collect();
    splits.dedup();
    let files: Vec<PathBuf> = all
        .into_iter()
        .filter(|p| split_of(p).as_deref() == Some(split))
        .collect();
    if files.is_empty() {
        splits.sort();
        splits.dedup();
        return Some(Err(splits));
    }
    Some(Ok(files))
}

/// The split of a file by its path under `data/`: `<split>/...`, or
/// `<split>-00000-of-00002.parquet` and `<split>.parquet`.
pub(crate) fn split_of(relative: &str) -> Option<String> {
    match relative.split_once('/') {
        Some((folder, _)) => Some(folder.to_string()),
        None => {
            let stem = relative
                .strip_suffix(".parquet")
                .or_else(|| relative.strip_suffix(".PARQUET"))?;
            Some(stem.split(['-', '.']).next().unwrap_or(stem).to_string())
        }
    }
}

/// Every `.parquet` file under `dir`, recursively (unreadable folders are passed over).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
        {
            out.push(path);
        }
    }
}

/// The class names of `column` in a file's `huggingface` metadata (`datasets`' features: a
/// `ClassLabel` with its `names`).
pub(crate) fn names_in_metadata(
    metadata: Option<&Vec<KeyValue>>,
    column: &str,
) -> Option<Vec<String>> {
    let text = metadata?
        .iter()
        .find(|kv| kv.key == "huggingface")?
        .value
        .as_deref()?;
    let json: serde_json::Value = serde_json::from_str(text).ok()?;
    let features = json.get("info")?.get("features")?;
    let feature = features.get(column)?;
    if feature.get("_type")?.as_str()? != "ClassLabel" {
        return None;
    }
    feature
        .get("names")?
        .as_array()?
        .iter()
        .map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// The class names of `column` in the YAML header of a dataset card (`README.md`):
/// `dataset_info.features`, the entry `name: column`, its `dtype.class_label.names`.
pub(crate) fn names_in_card(card: &str, column: &str) -> Option<Vec<String>> {
    let mut lines = card.lines();
    if lines.next()?.trim() != "---" {
        return None;
    }
    let header: Vec<&str> = lines.take_while(|l| l.trim() != "---").collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let start = header.iter().position(|l| {
        let t = l.trim();
        t.strip_prefix("- name:")
            .is_some_and(|name| unquote(name.trim()) == column)
    })?;
    let feature_indent = indent(header[start]);
    let mut names: Vec<(usize, String)> = Vec::new();
    let mut names_indent = None;
    for line in &header[start + 1..] {
        if line.trim().is_empty() {
            continue;
        }
        let at = indent(line);
        if at <= feature_indent {
            break;
        }
        let text = line.trim();
        match names_indent {
            None if text == "names:" => names_indent = Some(at),
            Some(outer) if at > outer => {
                let (key, value) = text.split_once(':')?;
                let index: usize = unquote(key.trim()).parse().ok()?;
                names.push((index, unquote(value.trim()).to_string()));
            }
            Some(_) => break,
            None => {}
        }
    }
    if names.is_empty() {
        return None;
    }
    names.sort_by_key(|(i, _)| *i);
    let complete = names.iter().enumerate().all(|(k, (i, _))| k == *i);
    complete.then(|| names.into_iter().map(|(_, n)| n).collect())
}

/// YAML's quotes taken off a plain scalar.
fn unquote(text: &str) -> &str {
    for q in ['\'', '"'] {
        if let Some(inner) = text.strip_prefix(q).and_then(|t| t.strip_suffix(q)) {
            return inner;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_come_from_the_card() {
        let card = "---\nlicense: mit\ndataset_info:\n  features:\n  - name: image\n    \
                    dtype: image\n  - name: label\n    dtype:\n      class_label:\n        \
                    names:\n          '0': cat\n          '1': \"hot dog\"\n          '2': bird\n  \
                    - name: caption\n    dtype: string\n  splits:\n  - name: train\n---\n# Card\n";
        assert_eq!(
            names_in_card(card, "label"),
            Some(vec!["cat".into(), "hot dog".into(), "bird".into()])
        );
        assert_eq!(names_in_card(card, "caption"), None);
        assert_eq!(names_in_card("# no header", "label"), None);
    }
}
