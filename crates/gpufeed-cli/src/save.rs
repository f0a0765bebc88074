//! `--save`: the output rows as one `.npy` and the id of each row in a text file beside it, both
//! written under temporary names and renamed into place only when the run succeeds, so a file
//! of that name is either complete or absent.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use gpufeed::{DType, HostTensor, Source};

use crate::npy::NpyWriter;
use crate::Result;

/// `FILE.paths.txt` for `FILE.npy` (or `FILE.paths.txt` beside any other name).
pub fn paths_file(npy: &Path) -> PathBuf {
    sibling(npy, ".paths.txt")
}

/// `FILE<suffix>` for `FILE.npy`, or the name with the suffix added.
pub fn sibling(npy: &Path, suffix: &str) -> PathBuf {
    let name = npy.as_os_str().to_string_lossy();
    match name.strip_suffix(".npy") {
        Some(stem) => PathBuf::from(format!("{stem}{suffix}")),
        None => {
            let mut name = npy.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        }
    }
}

/// One row's id on one line and in one tab-separated column: backslash, tab, newline and
/// carriage return escaped as `\\`, `\t`, `\n` and `\r`, whatever the file names hold.
pub fn escape_line(id: &str) -> String {
    escape_bytes(id.as_bytes())
}

/// A file name's bytes on one line: as [`escape_line`], and every byte that is not part of
/// valid UTF-8 written `\xNN`, so that Python's `codecs.escape_decode` gives the bytes back
/// (and `os.fsdecode` of them a name that opens).
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut line = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => line.push_str("\\\\"),
                '\t' => line.push_str("\\t"),
                '\n' => line.push_str("\\n"),
                '\r' => line.push_str("\\r"),
                c => line.push(c),
            }
        }
        for byte in chunk.invalid() {
            line.push_str(&format!("\\x{byte:02x}"));
        }
    }
    line
}

/// A file being written under a temporary name in its final folder.
struct Pending {
    temporary: PathBuf,
    target: PathBuf,
}

impl Pending {
    fn new(target: PathBuf) -> Pending {
        let mut name = target.as_os_str().to_owned();
        name.push(format!(".partial-{}", std::process::id()));
        Pending {
            temporary: PathBuf::from(name),
            target,
        }
    }
}

/// The files of `--save`, written as batches arrive.
pub struct Saver {
    npy: Option<NpyWriter>,
    npy_file: Pending,
    ids: Pending,
    ids_writer: std::io::BufWriter<fs::File>,
    extra: Vec<(Pending, std::io::BufWriter<fs::File>)>,
    finished: bool,
}

impl Saver {
    /// Opens the temporary files for `target`. Refuses a target that exists unless `overwrite`,
    /// and always one that is an image of `source`. `extra` names further text files written
    /// beside it (by their suffix, e.g. `.labels.txt`).
    pub fn create(
        target: &Path,
        dtype: DType,
        source: &Source,
        overwrite: bool,
        extra: &[&str],
    ) -> Result<Saver> {
        let mut targets = vec![target.to_path_buf(), paths_file(target)];
        targets.extend(extra.iter().map(|suffix| sibling(target, suffix)));
        for path in &targets {
            refuse_clobbering(path, source, overwrite)?;
        }
        let npy_file = Pending::new(target.to_path_buf());
        let ids = Pending::new(paths_file(target));
        let npy = NpyWriter::create(&npy_file.temporary, dtype)?;
        let ids_writer = create(&ids.temporary)?;
        let mut extra_files = Vec::new();
        for suffix in extra {
            let pending = Pending::new(sibling(target, suffix));
            let writer = create(&pending.temporary)?;
            extra_files.push((pending, writer));
        }
        Ok(Saver {
            npy: Some(npy),
            npy_file,
            ids,
            ids_writer,
            extra: extra_files,
            finished: false,
        })
    }

    /// Appends a batch's rows and their names (escaped already: see [`escape_bytes`]).
    pub fn append(&mut self, images: &HostTensor, names: &[&str]) -> Result<()> {
        if let Some(npy) = &mut self.npy {
            npy.append(images)?;
        }
        for name in names {
            writeln!(self.ids_writer, "{name}")
                .map_err(|e| format!("cannot write {}: {e}", self.ids.temporary.display()))?;
        }
        Ok(())
    }

    /// Appends lines to the extra file `index` (in the order given to [`Saver::create`]).
    pub fn append_extra(&mut self, index: usize, lines: &[String]) -> Result<()> {
        let Some((pending, writer)) = self.extra.get_mut(index) else {
            return Err("no such extra file".into());
        };
        for line in lines {
            writeln!(writer, "{line}")
                .map_err(|e| format!("cannot write {}: {e}", pending.temporary.display()))?;
        }
        Ok(())
    }

    /// Completes the files and moves them into place: the id files first and the `.npy` last,
    /// so a run killed in between leaves no `.npy` that disagrees with them. Returns the files
    /// written, the `.npy` first.
    pub fn finish(mut self) -> Result<Vec<PathBuf>> {
        if let Some(npy) = self.npy.take() {
            npy.finish()?;
        }
        let flush = |writer: &mut std::io::BufWriter<fs::File>, path: &Path| -> Result<()> {
            writer
                .flush()
                .and_then(|_| writer.get_ref().sync_all())
                .map_err(|e| format!("cannot write {}: {e}", path.display()).into())
        };
        flush(&mut self.ids_writer, &self.ids.temporary)?;
        for (pending, writer) in &mut self.extra {
            flush(writer, &pending.temporary)?;
        }
        // An older .npy must not outlive the ids written for the new one.
        if self.npy_file.target.exists() {
            fs::remove_file(&self.npy_file.target)
                .map_err(|e| format!("cannot replace {}: {e}", self.npy_file.target.display()))?;
        }
        let renames = self
            .extra
            .iter()
            .map(|(pending, _)| pending)
            .chain([&self.ids, &self.npy_file]);
        for pending in renames {
            fs::rename(&pending.temporary, &pending.target).map_err(|e| {
                format!(
                    "cannot move {} to {}: {e}",
                    pending.temporary.display(),
                    pending.target.display()
                )
            })?;
        }
        self.finished = true;
        let written = [&self.npy_file, &self.ids]
            .into_iter()
            .chain(self.extra.iter().map(|(pending, _)| pending))
            .map(|pending| pending.target.clone())
            .collect();
        Ok(written)
    }
}

impl Drop for Saver {
    /// A run that did not finish leaves no file behind.
    fn drop(&mut self) {
        if !self.finished {
            self.npy.take();
            let _ = fs::remove_file(&self.npy_file.temporary);
            let _ = fs::remove_file(&self.ids.temporary);
            for (pending, _) in &self.extra {
                let _ = fs::remove_file(&pending.temporary);
            }
        }
    }
}

fn create(path: &Path) -> Result<std::io::BufWriter<fs::File>> {
    fs::File::create(path)
        .map(std::io::BufWriter::new)
        .map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}

/// Refuses to write over `path` when it exists and `overwrite` is not given, and always when it
/// is one of the images being read.
fn refuse_clobbering(path: &Path, source: &Source, overwrite: bool) -> Result<()> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(());
    };
    if !overwrite {
        return Err(format!(
            "{} exists: give --overwrite to replace it, or another --save name",
            path.display()
        )
        .into());
    }
    use std::os::unix::fs::MetadataExt;
    let same = |other: &fs::Metadata| other.dev() == meta.dev() && other.ino() == meta.ino();
    for index in 0..source.len() {
        let Some(image) = source.path(index) else {
            continue;
        };
        if fs::metadata(image).is_ok_and(|m| same(&m)) {
            return Err(format!(
                "{} is one of the images this run reads: --save must name another file",
                path.display()
            )
            .into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_stays_on_one_line() {
        assert_eq!(escape_line("a\nb"), "a\\nb");
        assert_eq!(escape_line("c:\\d\r"), "c:\\\\d\\r");
        assert_eq!(escape_line("plain.jpg"), "plain.jpg");
        assert_eq!(escape_line("tab\there"), "tab\\there");
        assert_eq!(escape_bytes(b"caf\xc3\xa9 \xff.jpg"), "caf\u{e9} \\xff.jpg");
    }

    #[test]
    fn sibling_names() {
        assert_eq!(
            paths_file(Path::new("o/x.npy")),
            PathBuf::from("o/x.paths.txt")
        );
        assert_eq!(paths_file(Path::new("x")), PathBuf::from("x.paths.txt"));
        assert_eq!(
            sibling(Path::new("x.npy"), ".crops.tsv"),
            PathBuf::from("x.crops.tsv")
        );
    }
}
