//! `--save`: the output rows as one `.npy` and the files beside it (ids, labels, draws, soft
//! labels, a patch sequence's side tensors), written as one set: every file under a temporary name of this process, moved into
//! place together only when the run succeeds, so the set is this run's whole or not there.
//!
//! How the set stays whole, with other runs and after a kill:
//! - The `.npy`'s temporary file (`FILE.npy.partial-PID`) is locked (`flock`) for the run's life:
//!   another run saving to the same name finds it locked and refuses at its start; a lock that
//!   can be taken belongs to a process that died.
//! - The folder itself is locked while a run checks and creates its temporary files, and while
//!   it moves them into place: two runs never interleave their moves.
//! - Before the moves, a record of them (`FILE.npy.commit-PID`, one suffix a line) is written:
//!   a run killed mid-way leaves the record, and the next run saving there finishes the moves;
//!   without a record, the dead run's temporary files are removed.
//! - With `--overwrite`, the files of an earlier set that this run does not write (a labels
//!   file, say) are removed with the moves, so no set mixes two runs.

use std::fs;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use gpufeed::{DType, HostTensor, Source};

use crate::npy::{LittleEndian, NpyWriter};
use crate::Result;

/// Every suffix a set may hold beside the `.npy` (the paths file first): the files of an
/// earlier set not written again are removed with `--overwrite`.
pub const SET_SUFFIXES: [&str; 13] = [
    ".paths.txt",
    ".labels.txt",
    ".extra.tsv",
    ".crops.tsv",
    ".augment.jsonl",
    ".soft_labels.npy",
    ".classes.txt",
    ".grids.npy",
    ".cu_seqlens.npy",
    ".mask.npy",
    ".spatial_shapes.npy",
    ".coordinates.npy",
    "",
];

/// The side tensors of a patch sequence that `--save` writes beside its tokens, and their
/// element types: each image's grid `(t, h, w)` (`image_grid_thw`), where each image's rows
/// begin in the tokens file and the rows in all (`cu_seqlens` over the whole file), and for
/// padded batches each row's mask and patch (row, column), SigLIP2's `spatial_shapes`.
pub const PATCH_FILES: [(&str, DType); 5] = [
    (".grids.npy", DType::I64),
    (".cu_seqlens.npy", DType::I64),
    (".mask.npy", DType::I32),
    (".spatial_shapes.npy", DType::I64),
    (".coordinates.npy", DType::I64),
];

/// `FILE<suffix>` for `FILE.npy`, or the name with the suffix added.
pub fn sibling(npy: &Path, suffix: &str) -> PathBuf {
    if suffix.is_empty() {
        return npy.to_path_buf();
    }
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

/// Every file of the set `--save npy` may write: the `.npy` and each of [`SET_SUFFIXES`].
pub fn set_files(npy: &Path) -> Vec<PathBuf> {
    SET_SUFFIXES.iter().map(|s| sibling(npy, s)).collect()
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

/// `path` with `.partial-PID` added: a temporary file of process `pid`.
fn partial(path: &Path, pid: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".partial-{pid}"));
    PathBuf::from(name)
}

/// The record of process `pid`'s moves into place for the set of `npy`.
fn record(npy: &Path, pid: u32) -> PathBuf {
    let mut name = npy.as_os_str().to_owned();
    name.push(format!(".commit-{pid}"));
    PathBuf::from(name)
}

/// What a file of the set is written with.
enum Writer {
    Npy(Option<NpyWriter>),
    Text(std::io::BufWriter<fs::File>),
}

/// One file of the set, written under its temporary name.
struct Output {
    suffix: &'static str,
    temporary: PathBuf,
    target: PathBuf,
    writer: Writer,
}

/// The folder holding a set, locked while held: no other run checks, creates or moves the
/// files of a set there meanwhile.
struct FolderLock(fs::File);

impl FolderLock {
    fn take(folder: &Path) -> Result<FolderLock> {
        let dir = fs::File::open(folder)
            .map_err(|e| format!("cannot open the folder {}: {e}", folder.display()))?;
        rustix::fs::flock(dir.as_fd(), rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| format!("cannot lock the folder {}: {e}", folder.display()))?;
        Ok(FolderLock(dir))
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(self.0.as_fd(), rustix::fs::FlockOperation::Unlock);
    }
}

/// The files of `--save`, written as batches arrive.
pub struct Saver {
    npy: PathBuf,
    folder: PathBuf,
    outputs: Vec<Output>,
    /// The `.npy`'s temporary file, opened again and locked for the run's life.
    _lock: fs::File,
    overwrite: bool,
    finished: bool,
}

impl Saver {
    /// Opens the temporary files of the set of `target` (the `.npy`, the paths file, and the
    /// files of `extra`, by their suffix among [`SET_SUFFIXES`]), after finishing or removing
    /// what runs that died left there. Refuses a set another run is writing now, a target that
    /// exists unless `overwrite`, and always one that is an image of `source`.
    pub fn create(
        target: &Path,
        dtype: DType,
        source: &Source,
        overwrite: bool,
        extra: &[&'static str],
    ) -> Result<Saver> {
        let folder = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let lock = FolderLock::take(&folder)?;
        recover(target, &folder)?;
        let mut suffixes: Vec<&'static str> = vec!["", ".paths.txt"];
        suffixes.extend_from_slice(extra);
        for suffix in &suffixes {
            refuse_clobbering(&sibling(target, suffix), source, overwrite)?;
        }
        let pid = std::process::id();
        let mut outputs = Vec::with_capacity(suffixes.len());
        let mut saver_lock = None;
        for suffix in suffixes {
            let target_file = sibling(target, suffix);
            let temporary = partial(&target_file, pid);
            let writer = if suffix.is_empty() || suffix.ends_with(".npy") {
                let side = PATCH_FILES.iter().find(|(s, _)| *s == suffix);
                let writer = match (suffix, side) {
                    ("", _) => NpyWriter::create(&temporary, dtype)?,
                    (_, Some(&(_, dtype))) => NpyWriter::create(&temporary, dtype)?,
                    _ => NpyWriter::create_matrix(&temporary)?,
                };
                if suffix.is_empty() {
                    let file = fs::File::open(&temporary)
                        .map_err(|e| format!("cannot open {}: {e}", temporary.display()))?;
                    rustix::fs::flock(file.as_fd(), rustix::fs::FlockOperation::LockExclusive)
                        .map_err(|e| format!("cannot lock {}: {e}", temporary.display()))?;
                    saver_lock = Some(file);
                }
                Writer::Npy(Some(writer))
            } else {
                Writer::Text(create(&temporary)?)
            };
            outputs.push(Output {
                suffix,
                temporary,
                target: target_file,
                writer,
            });
        }
        drop(lock);
        let Some(lock) = saver_lock else {
            return Err("no .npy in the set".into());
        };
        Ok(Saver {
            npy: target.to_path_buf(),
            folder,
            outputs,
            _lock: lock,
            overwrite,
            finished: false,
        })
    }

    fn output(&mut self, suffix: &str) -> Result<&mut Output> {
        self.outputs
            .iter_mut()
            .find(|o| o.suffix == suffix)
            .ok_or_else(|| format!("no {suffix} file in the set").into())
    }

    /// Whether the set has the file of `suffix`.
    pub fn has(&self, suffix: &str) -> bool {
        self.outputs.iter().any(|o| o.suffix == suffix)
    }

    /// Appends a batch's rows and their names (escaped already: see [`escape_bytes`]).
    pub fn append(&mut self, images: &HostTensor, names: &[&str]) -> Result<()> {
        self.append_npy("", images)?;
        let lines: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self.append_lines(".paths.txt", &lines)
    }

    /// Appends the rows of `tensor` to the `.npy` file of `suffix` (`""`: the images).
    pub fn append_npy(&mut self, suffix: &str, tensor: &HostTensor) -> Result<()> {
        match &mut self.output(suffix)?.writer {
            Writer::Npy(Some(npy)) => npy.append(tensor),
            _ => Err(format!("the {suffix} file is not a .npy").into()),
        }
    }

    /// Appends `tensor` to the `.npy` file of `suffix` as rows of its last axis (a patch
    /// sequence's tokens, `[rows, patch_dim]`, whether packed or padded).
    pub fn append_vectors(&mut self, suffix: &str, tensor: &HostTensor) -> Result<()> {
        match &mut self.output(suffix)?.writer {
            Writer::Npy(Some(npy)) => npy.append_vectors(tensor),
            _ => Err(format!("the {suffix} file is not a .npy").into()),
        }
    }

    /// Appends `values` as rows of `row_shape` to the `.npy` file of `suffix`.
    pub fn append_values<T: LittleEndian>(
        &mut self,
        suffix: &str,
        values: &[T],
        row_shape: &[usize],
    ) -> Result<()> {
        match &mut self.output(suffix)?.writer {
            Writer::Npy(Some(npy)) => npy.append_values(values, row_shape),
            _ => Err(format!("the {suffix} file is not a .npy").into()),
        }
    }

    /// Appends lines to the text file of `suffix`.
    pub fn append_lines(&mut self, suffix: &str, lines: &[String]) -> Result<()> {
        let output = self.output(suffix)?;
        let Writer::Text(writer) = &mut output.writer else {
            return Err(format!("the {suffix} file is not text").into());
        };
        for line in lines {
            writeln!(writer, "{line}")
                .map_err(|e| format!("cannot write {}: {e}", output.temporary.display()))?;
        }
        Ok(())
    }

    /// Completes the files and moves them into place as one set (see the module's notes).
    /// Returns the files written, the `.npy` first.
    pub fn finish(mut self) -> Result<Vec<PathBuf>> {
        for output in &mut self.outputs {
            match &mut output.writer {
                Writer::Npy(npy) => {
                    if let Some(npy) = npy.take() {
                        npy.finish()?;
                    }
                }
                Writer::Text(writer) => writer
                    .flush()
                    .and_then(|_| writer.get_ref().sync_all())
                    .map_err(|e| format!("cannot write {}: {e}", output.temporary.display()))?,
            }
        }
        let _lock = FolderLock::take(&self.folder)?;
        if !self.overwrite {
            if let Some(there) = self.outputs.iter().find(|o| o.target.exists()) {
                return Err(format!(
                    "{} appeared while this run was writing it: nothing replaced; give \
                     --overwrite to replace it, or another --save name",
                    there.target.display()
                )
                .into());
            }
        }
        // Files of an earlier set this run does not write go with the moves.
        let written: Vec<&str> = self.outputs.iter().map(|o| o.suffix).collect();
        let removed: Vec<&str> = SET_SUFFIXES
            .iter()
            .copied()
            .filter(|s| !written.contains(s) && sibling(&self.npy, s).exists())
            .collect();
        // The .npy last: a reader that waits for it finds the rest there.
        let mut moves: Vec<&str> = written.iter().copied().filter(|s| !s.is_empty()).collect();
        moves.push("");
        let pid = std::process::id();
        let record_path = record(&self.npy, pid);
        let mut text = String::new();
        for suffix in &removed {
            text.push_str(&format!("remove {suffix}\n"));
        }
        for suffix in &moves {
            text.push_str(&format!("move {suffix}\n"));
        }
        write_synced(&record_path, text.as_bytes())?;
        sync_folder(&self.folder);
        apply(&self.npy, pid, &text)?;
        fs::remove_file(&record_path)
            .map_err(|e| format!("cannot remove {}: {e}", record_path.display()))?;
        sync_folder(&self.folder);
        self.finished = true;
        Ok(self.outputs.iter().map(|o| o.target.clone()).collect())
    }
}

impl Drop for Saver {
    /// A run that did not finish leaves no file behind.
    fn drop(&mut self) {
        if !self.finished {
            for output in &mut self.outputs {
                if let Writer::Npy(npy) = &mut output.writer {
                    npy.take();
                }
                let _ = fs::remove_file(&output.temporary);
            }
        }
    }
}

/// Carries out a record of moves of process `pid` for the set of `npy`: each `remove SUFFIX`
/// removes that file of the set, each `move SUFFIX` renames the file's temporary into place
/// (a move whose temporary is gone was made already).
fn apply(npy: &Path, pid: u32, record: &str) -> Result<()> {
    for line in record.lines() {
        let (what, suffix) = line.split_once(' ').unwrap_or((line, ""));
        if !SET_SUFFIXES.contains(&suffix) {
            return Err(format!("{}: unknown entry {line:?}", npy.display()).into());
        }
        let target = sibling(npy, suffix);
        match what {
            "remove" => {
                if target.exists() {
                    fs::remove_file(&target)
                        .map_err(|e| format!("cannot replace {}: {e}", target.display()))?;
                }
            }
            "move" => {
                let temporary = partial(&target, pid);
                if temporary.exists() {
                    fs::rename(&temporary, &target).map_err(|e| {
                        format!(
                            "cannot move {} to {}: {e}",
                            temporary.display(),
                            target.display()
                        )
                    })?;
                }
            }
            _ => return Err(format!("{}: unknown entry {line:?}", npy.display()).into()),
        }
    }
    Ok(())
}

/// What runs that died left for the set of `npy` in `folder` (locked): a record of moves is
/// carried out; temporary files without one are removed. Refuses while another run that is
/// alive writes the set.
fn recover(npy: &Path, folder: &Path) -> Result<()> {
    let names: Vec<String> = set_files(npy)
        .iter()
        .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
        .collect();
    let npy_name = npy
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let entries =
        fs::read_dir(folder).map_err(|e| format!("cannot list {}: {e}", folder.display()))?;
    let mut pids = std::collections::BTreeSet::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        for base in &names {
            let pid = name
                .strip_prefix(base.as_str())
                .and_then(|rest| rest.strip_prefix(".partial-"))
                .or_else(|| {
                    (base == &npy_name)
                        .then(|| name.strip_prefix(&format!("{base}.commit-")))
                        .flatten()
                });
            if let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok()) {
                pids.insert(pid);
            }
        }
    }
    for pid in pids {
        let held = partial(npy, pid);
        if let Ok(file) = fs::File::open(&held) {
            let free = rustix::fs::flock(
                file.as_fd(),
                rustix::fs::FlockOperation::NonBlockingLockExclusive,
            );
            if free.is_err() {
                return Err(format!(
                    "another gpufeed run (process {pid}) is saving to {} now: wait for it to \
                     end, or give another --save name",
                    npy.display()
                )
                .into());
            }
        }
        let record_path = record(npy, pid);
        // A run killed while moving its set into place: the moves are finished.
        if let Ok(text) = fs::read_to_string(&record_path) {
            apply(npy, pid, &text)?;
            let _ = fs::remove_file(&record_path);
        }
        for file in set_files(npy) {
            let _ = fs::remove_file(partial(&file, pid));
        }
    }
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file =
        fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    file.write_all(bytes)
        .and_then(|_| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}

/// Flushes the folder's entries (the renames) to the disk, where the system allows.
fn sync_folder(folder: &Path) {
    if let Ok(dir) = fs::File::open(folder) {
        let _ = dir.sync_all();
    }
}

fn create(path: &Path) -> Result<std::io::BufWriter<fs::File>> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
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
            sibling(Path::new("o/x.npy"), ".paths.txt"),
            PathBuf::from("o/x.paths.txt")
        );
        assert_eq!(
            sibling(Path::new("x"), ".paths.txt"),
            PathBuf::from("x.paths.txt")
        );
        assert_eq!(
            sibling(Path::new("x.npy"), ".crops.tsv"),
            PathBuf::from("x.crops.tsv")
        );
        assert_eq!(sibling(Path::new("x.npy"), ""), PathBuf::from("x.npy"));
    }

    /// A record left by a run killed mid-way is finished by the next run: the set is whole.
    #[test]
    fn a_set_left_half_moved_is_finished_and_stale_files_go() {
        let dir = std::env::temp_dir().join(format!("gpufeed-save-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let npy = dir.join("out.npy");
        // A dead run (no such process holds a lock): its .paths.txt moved, its .npy not yet.
        let dead = 999_999;
        fs::write(partial(&npy, dead), b"npy").unwrap();
        fs::write(sibling(&npy, ".paths.txt"), b"paths").unwrap();
        fs::write(sibling(&npy, ".labels.txt"), b"old labels").unwrap();
        fs::write(
            record(&npy, dead),
            "remove .labels.txt\nmove .paths.txt\nmove \n",
        )
        .unwrap();
        // Another dead run's temporaries, with no record: removed.
        fs::write(partial(&sibling(&npy, ".crops.tsv"), 424_242), b"x").unwrap();
        recover(&npy, &dir).unwrap();
        let mut names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["out.npy", "out.paths.txt"]);
        assert_eq!(fs::read(&npy).unwrap(), b"npy");
        // A live run's set (its .npy temporary locked): refused.
        let live = partial(&npy, 7);
        fs::write(&live, b"").unwrap();
        let holder = fs::File::open(&live).unwrap();
        rustix::fs::flock(holder.as_fd(), rustix::fs::FlockOperation::LockExclusive).unwrap();
        let error = recover(&npy, &dir).unwrap_err().to_string();
        assert!(error.contains("another gpufeed run (process 7)"), "{error}");
        drop(holder);
        recover(&npy, &dir).unwrap();
        assert!(!live.exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
