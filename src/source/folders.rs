//! Listing folders exactly as torchvision's `ImageFolder` does (`find_classes` and
//! `make_dataset` in `torchvision/datasets/folder.py`): image files by extension, folders
//! visited in sorted order of their path and files sorted by name within each (what
//! `sorted(os.walk(root, followlinks=True))` gives), classes from the sorted names of the
//! subfolders, a class without images refused, and subfolders that cannot be read skipped.
//! Plain folders take every format gpufeed decodes ([`DECODED_EXTENSIONS`]); ImageFolder keeps
//! torchvision's list ([`IMAGE_EXTENSIONS`]). Files left out are counted by extension. A
//! symbolic link to a folder that the listing reaches anyway (inside the root, or inside a
//! class) is not followed, so no image is listed twice and no link makes the walk loop.

use std::collections::{BTreeMap, HashSet};
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

/// File extensions (compared without case) that [`crate::Source::directory`] and WebDataset
/// shards take as images: every format gpufeed decodes ([`IMAGE_EXTENSIONS`], and GIF, the
/// other PNM kinds and JPEG's other names).
pub const DECODED_EXTENSIONS: [&str; 15] = [
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp", "gif", "pbm", "pnm", "pam",
    "jpe", "jfif",
];

/// One ImageFolder class: its name and its image files in order.
pub(super) struct Class {
    pub name: String,
    pub files: Vec<PathBuf>,
}

/// Folders a listing could not read, each with the reason.
pub(super) type Unreadable = Vec<(PathBuf, String)>;

/// Files a listing left out, by extension (lower case, without the dot; empty for none).
pub(super) type LeftOut = BTreeMap<String, usize>;

/// What a listing found: the image files, the folders it could not read (skipped, as
/// torchvision's `os.walk` skips them) and the files it left out.
#[derive(Default)]
pub(super) struct Listing {
    pub files: Vec<PathBuf>,
    pub unreadable: Unreadable,
    pub left_out: LeftOut,
}

/// Every file under `root` with an extension of [`DECODED_EXTENSIONS`], in torchvision's
/// order. `root` itself must be readable.
pub(super) fn image_files(root: &Path) -> Result<Listing> {
    read_dir_sorted(root).map_err(|e| source_error(root, e))?;
    let mut listing = Listing::default();
    let reached = [fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf())];
    walk_images(root, &DECODED_EXTENSIONS, &reached, &mut listing);
    Ok(listing)
}

/// What an ImageFolder listing found: its classes, the folders it could not read and the files
/// it left out.
pub(super) struct Classes {
    pub classes: Vec<Class>,
    pub unreadable: Unreadable,
    pub left_out: LeftOut,
}

/// torchvision's `ImageFolder` classes of `root`, sorted by name, each with its images; like
/// torchvision, refuses a root without class folders and a class without images.
pub(super) fn image_folder(root: &Path) -> Result<Classes> {
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
    let mut left_out = LeftOut::new();
    let mut out = Vec::with_capacity(classes.len());
    let mut empty = Vec::new();
    // Folders every class reaches anyway: the root and the classes themselves (a class may be a
    // link to a folder elsewhere, as torchvision allows).
    let real = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let reached: Vec<PathBuf> = std::iter::once(real(root))
        .chain(classes.iter().map(|(_, dir)| real(dir)))
        .collect();
    for (name, dir) in classes {
        let mut listing = Listing::default();
        walk_images(&dir, &IMAGE_EXTENSIONS, &reached, &mut listing);
        unreadable.extend(listing.unreadable);
        for (extension, count) in listing.left_out {
            *left_out.entry(extension).or_default() += count;
        }
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
    Ok(Classes {
        classes: out,
        unreadable,
        left_out,
    })
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

/// Whether the file name ends in one of `extensions`, compared without case, as torchvision's
/// `has_file_allowed_extension` does (so a file named just `.jpg` counts too).
pub(super) fn has_extension(p: &Path, extensions: &[&str]) -> bool {
    let Some(name) = p.file_name() else {
        return false;
    };
    let name = name.as_bytes().to_ascii_lowercase();
    extensions.iter().any(|ext| {
        name.len() > ext.len()
            && name.ends_with(ext.as_bytes())
            && name[name.len() - ext.len() - 1] == b'.'
    })
}

/// The extension a left-out file is counted under: lower case, empty without one.
pub(super) fn extension_of(p: &Path) -> String {
    p.extension()
        .map(|e| String::from_utf8_lossy(e.as_bytes()).to_lowercase())
        .unwrap_or_default()
}

/// Appends the files under `dir` with one of `extensions` in torchvision's order: folders
/// visited in sorted order of their path, files sorted by name within each folder, other files
/// counted as left out. Symbolic links are followed, each real folder is visited once, and a
/// link to a folder inside one of `reached` (visited in its own right) is not followed; a folder
/// that cannot be read is skipped and noted.
fn walk_images(dir: &Path, extensions: &[&str], reached: &[PathBuf], listing: &mut Listing) {
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
                let linked = fs::symlink_metadata(&path).is_ok_and(|m| m.is_symlink());
                let reached_anyway = linked
                    && fs::canonicalize(&path)
                        .is_ok_and(|real| reached.iter().any(|r| real.starts_with(r)));
                if !reached_anyway {
                    pending.push(path);
                }
            } else if has_extension(&path, extensions) {
                files.push(path);
            } else {
                *listing.left_out.entry(extension_of(&path)).or_default() += 1;
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
            assert!(has_extension(Path::new(yes), &IMAGE_EXTENSIONS), "{yes}");
        }
        for no in ["a.gif", "b.txt", "jpg", "c.jpgx", "d.jp g"] {
            assert!(!has_extension(Path::new(no), &IMAGE_EXTENSIONS), "{no}");
        }
        assert!(has_extension(Path::new("a.GIF"), &DECODED_EXTENSIONS));
    }
}
