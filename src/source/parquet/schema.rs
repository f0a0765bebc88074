//! Finding the columns a source needs in a Parquet file's schema: the image (a struct with a
//! `bytes` field, as Hugging Face's `Image()` feature writes it, or plain binary), the label (an
//! integer, or text mapped to a class index) and the extra columns (plain values); and checking
//! that every file of a source lays them out alike.

use parquet::basic::Type;
use parquet::schema::types::SchemaDescriptor;

/// Where the needed columns are in one file's leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Columns {
    /// The leaf holding the image bytes.
    pub image: usize,
    /// The label's leaf and whether it is text.
    pub label: Option<(usize, LabelKind)>,
    /// The extra columns' leaves, in the order asked.
    pub extras: Vec<usize>,
    /// The layout in words, compared between files.
    pub layout: String,
}

/// How labels are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LabelKind {
    /// Class numbers.
    Int,
    /// Class names, numbered in sorted order.
    Text,
}

/// The leaf whose path is `path`, if it is a plain (not repeated) leaf.
fn leaf(schema: &SchemaDescriptor, path: &[&str]) -> Result<Option<usize>, String> {
    for (i, column) in schema.columns().iter().enumerate() {
        let parts = column.path().parts();
        if parts.len() == path.len() && parts.iter().zip(path).all(|(a, b)| a == b) {
            if column.max_rep_level() > 0 {
                return Err(format!(
                    "column {} is a list (repeated); only plain columns are read",
                    path.join(".")
                ));
            }
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// The top-level column names, for errors.
fn names(schema: &SchemaDescriptor) -> String {
    let root = schema.root_schema();
    let fields: Vec<&str> = root.get_fields().iter().map(|f| f.name()).collect();
    fields.join(", ")
}

/// The needed columns of `schema`: image column `image`; label column `label` (when
/// `label_required`, it must be there; otherwise it is used if there); the `extras`.
pub(crate) fn find(
    schema: &SchemaDescriptor,
    image: &str,
    label: &str,
    label_required: bool,
    extras: &[String],
) -> Result<Columns, String> {
    let missing = |name: &str| format!("no column {name:?} (the file has {})", names(schema));
    let kind = |i: usize| schema.column(i).physical_type();
    let image_leaf = match leaf(schema, &[image])? {
        Some(i) => i,
        None => leaf(schema, &[image, "bytes"])?.ok_or_else(|| missing(image))?,
    };
    if kind(image_leaf) != Type::BYTE_ARRAY {
        return Err(format!(
            "column {image:?} holds {}, not image bytes (binary, or a struct with a binary \
             `bytes` field)",
            kind(image_leaf)
        ));
    }
    let label = match leaf(schema, &[label])? {
        Some(i) => match kind(i) {
            Type::INT32 | Type::INT64 => Some((i, LabelKind::Int)),
            Type::BYTE_ARRAY => Some((i, LabelKind::Text)),
            other => {
                return Err(format!(
                    "label column {label:?} holds {other}: labels are integers or text"
                ))
            }
        },
        None if label_required => return Err(missing(label)),
        None => None,
    };
    let mut extra_leaves = Vec::with_capacity(extras.len());
    for name in extras {
        let i = leaf(schema, &[name.as_str()])?.ok_or_else(|| missing(name))?;
        extra_leaves.push(i);
    }
    let describe = |i: usize| {
        let c = schema.column(i);
        format!("{} {}", c.path().string(), c.physical_type())
    };
    let mut layout = vec![describe(image_leaf)];
    layout.extend(label.map(|(i, _)| describe(i)));
    layout.extend(extra_leaves.iter().map(|&i| describe(i)));
    Ok(Columns {
        image: image_leaf,
        label,
        extras: extra_leaves,
        layout: layout.join(", "),
    })
}
