//! Listing folders the way torchvision does: image files by extension, folders visited in sorted
//! order, files sorted by name within each folder, ImageFolder's classes from sorted subfolder
//! names.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// File extensions (compared without case) that folder listings take as images. The format itself
/// is sniffed from the bytes when the file is decoded, so a PNG named `.jpg` still decodes.
pub const IMAGE_EXTENSIONS: [&str; 8] = ["jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"];

/// One ImageFolder class: its name and its image files in order.
pub(super) struct Class {
    pub name: String,
    pub files: Vec<PathBuf>,
}

/// Every image file under `root`, in torchvision's order.
pub(super) fn image_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    walk_images(root, &mut files)?;
    Ok(files)
}

/// torchvision's `ImageFolder` classes of `root`, sorted by name.
pub(super) fn image_folder(root: &Path) -> Result<Vec<Class>> {
    let mut classes: Vec<(String, PathBuf)> = read_dir_sorted(root)?
        .into_iter()
        .filter(|p| p.is_dir())
        .map(|p| (file_name(&p), p))
        .collect();
    classes.sort();
    if classes.is_empty() {
        return Err(Error::Source {
            path: root.to_path_buf(),
            reason: "no class subfolders (ImageFolder wants root/<class>/<image>)".into(),
            source: None,
        });
    }
    classes
        .into_iter()
        .map(|(name, dir)| {
            Ok(Class {
                name,
                files: image_files(&dir)?,
            })
        })
        .collect()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let fail = |e: std::io::Error| Error::Source {
        path: dir.to_path_buf(),
        reason: e.to_string(),
        source: Some(e),
    };
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(fail)? {
        paths.push(entry.map_err(fail)?.path());
    }
    paths.sort();
    Ok(paths)
}

fn has_image_extension(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// Appends the image files under `dir` in torchvision's order: folders visited in sorted order of
/// their path, files sorted by name within each folder. Symbolic links are followed, each real
/// folder is visited once (a link back to a parent does not loop).
fn walk_images(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut folders: Vec<(String, Vec<PathBuf>)> = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    let mut visited = HashSet::new();
    while let Some(folder) = pending.pop() {
        // A folder that cannot be canonicalized is still listed (and its error reported there).
        let real = fs::canonicalize(&folder).unwrap_or_else(|_| folder.clone());
        if !visited.insert(real) {
            continue;
        }
        let mut files = Vec::new();
        for path in read_dir_sorted(&folder)? {
            if path.is_dir() {
                pending.push(path);
            } else if has_image_extension(&path) {
                files.push(path);
            }
        }
        folders.push((folder.to_string_lossy().into_owned(), files));
    }
    folders.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, files) in folders {
        out.extend(files);
    }
    Ok(())
}
