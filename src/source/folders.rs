//! Listing folders exactly as torchvision's `ImageFolder` does (`find_classes` and
//! `make_dataset` in `torchvision/datasets/folder.py`): image files by extension, folders
//! visited in sorted order of their path and files sorted by name within each (what
//! `sorted(os.walk(root, followlinks=True))` gives), classes from the sorted names of the
//! subfolders, a class without images refused, and subfolders that cannot be read skipped.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// File extensions (compared without case) that folder listings take as images: torchvision's
/// `IMG_EXTENSIONS`. The format itself is sniffed from the bytes when the file is decoded, so
/// a PNG named `.jpg` still decodes.
pub const IMAGE_EXTENSIONS: [&str; 9] = [
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
];

/// One ImageFolder class: its name and its image files in order.
pub(super) struct Class {
    pub name: String,
    pub files: Vec<PathBuf>,
}

/// Folders a listing could not read, each with the reason.
pub(super) type Unreadable = Vec<(PathBuf, String)>;

/// What a listing found: the image files, and the folders it could not read (skipped, as
/// torchvision's `os.walk` skips them).
#[derive(Default)]
pub(super) struct Listing {
    pub files: Vec<PathBuf>,
    pub unreadable: Unreadable,
}

/// Every image file under `root`, in torchvision's order. `root` itself must be readable.
pub(super) fn image_files(root: &Path) -> Result<Listing> {
    read_dir_sorted(root).map_err(|e| source_error(root, e))?;
    let mut listing = Listing::default();
    walk_images(root, &mut listing);
    Ok(listing)
}

/// torchvision's `ImageFolder` classes of `root`, sorted by name, each with its images; like
/// torchvision, refuses a root without class folders and a class without images.
pub(super) fn image_folder(root: &Path) -> Result<(Vec<Class>, Unreadable)> {
    let mut classes: Vec<(OsString, PathBuf)> = read_dir_sorted(root)
        .map_err(|e| source_error(root, e))?
        .into_iter()
        .filter(|p| p.is_dir())
        .filter_map(|p| Some((p.file_name()?.to_os_string(), p)))
        .collect();
    classes.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    if classes.is_empty() {
        return Err(Error::Source {
            path: root.to_path_buf(),
            reason: "no class folders (ImageFolder wants root/<class>/<image>)".into(),
            source: None,
        });
    }
    let mut unreadable = Vec::new();
    let mut out = Vec::with_capacity(classes.len());
    let mut empty = Vec::new();
    for (name, dir) in classes {
        let mut listing = Listing::default();
        walk_images(&dir, &mut listing);
        unreadable.extend(listing.unreadable);
        let name = super::path_id(Path::new(&name));
        if listing.files.is_empty() {
            empty.push(name.clone());
        }
        out.push(Class {
            name,
            files: listing.files,
        });
    }
    if !empty.is_empty() {
        return Err(Error::Source {
            path: root.to_path_buf(),
            reason: format!(
                "found no image file for the classes {}; image files end in .{}",
                empty.join(", "),
                IMAGE_EXTENSIONS.join(", .")
            ),
            source: None,
        });
    }
    Ok((out, unreadable))
}

fn source_error(path: &Path, e: std::io::Error) -> Error {
    Error::Source {
        path: path.to_path_buf(),
        reason: e.to_string(),
        source: Some(e),
    }
}

pub(super) fn read_dir_sorted(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()?;
    paths.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    Ok(paths)
}

/// Whether the file name ends in an image extension, compared without case, as torchvision's
/// `has_file_allowed_extension` does (so a file named just `.jpg` counts too).
pub(super) fn has_image_extension(p: &Path) -> bool {
    let Some(name) = p.file_name() else {
        return false;
    };
    let name = name.as_bytes().to_ascii_lowercase();
    IMAGE_EXTENSIONS.iter().any(|ext| {
        name.len() > ext.len()
            && name.ends_with(ext.as_bytes())
            && name[name.len() - ext.len() - 1] == b'.'
    })
}

/// Appends the image files under `dir` in torchvision's order: folders visited in sorted order of
/// their path, files sorted by name within each folder. Symbolic links are followed, each real
/// folder is visited once (a link back to a parent does not loop); a folder that cannot be read
/// is skipped and noted.
fn walk_images(dir: &Path, listing: &mut Listing) {
    let mut folders: Vec<(PathBuf, Vec<PathBuf>)> = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    let mut visited = HashSet::new();
    while let Some(folder) = pending.pop() {
        // A folder that cannot be canonicalized is still tried (and noted if unreadable).
        let real = fs::canonicalize(&folder).unwrap_or_else(|_| folder.clone());
        if !visited.insert(real) {
            continue;
        }
        let entries = match read_dir_sorted(&folder) {
            Ok(entries) => entries,
            Err(e) => {
                listing.unreadable.push((folder, e.to_string()));
                continue;
            }
        };
        let mut files = Vec::new();
        for path in entries {
            if path.is_dir() {
                pending.push(path);
            } else if has_image_extension(&path) {
                files.push(path);
            }
        }
        folders.push((folder, files));
    }
    folders.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
    for (_, files) in folders {
        listing.files.extend(files);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_like_torchvision() {
        for yes in [
            "a.jpg",
            "B.JPEG",
            "c.PnG",
            ".jpg",
            "d.tar.webp",
            "e.ppm",
            "f.PGM",
        ] {
            assert!(has_image_extension(Path::new(yes)), "{yes}");
        }
        for no in ["a.gif", "b.txt", "jpg", "c.jpgx", "d.jp g"] {
            assert!(!has_image_extension(Path::new(no)), "{no}");
        }
    }
}
