//! Finding the image's CUDA forward-compatibility directory, read-only.
//!
//! Where: `/usr/local/cuda/compat` (what NVIDIA's toolkit reads; in CUDA images
//! `/usr/local/cuda` links to the installed `/usr/local/cuda-X.Y`), else
//! `/usr/local/cuda-X.Y/compat` for the image's `CUDA_VERSION` (`X.Y.Z`). Any other
//! `cuda-*` directory is not looked at: which of several the image's programs use is not
//! something nvhook can know. Links on the way resolve inside the rootfs (pathrs), and only
//! regular files in the directory are listed: a link there (to `/proc/self/...`, say) is
//! never followed, so it never counts.

use super::{Rootfs, sys};
use crate::plan::CompatDir;
use crate::plan::compat::NVIDIA_COMPAT_DIR;
use std::os::fd::AsFd;

/// More than a compat directory ever holds (about ten files).
const MAX_ENTRIES: usize = 256;

impl Rootfs {
    /// The image's compat directory and the regular files in it, if it has one.
    pub fn cuda_compat(&self, cuda_version: Option<&str>) -> Option<CompatDir> {
        let versioned = cuda_version
            .and_then(crate::version::cuda_major_minor)
            .map(|v| format!("/usr/local/cuda-{v}/compat"));
        std::iter::once(NVIDIA_COMPAT_DIR.to_string())
            .chain(versioned)
            .find_map(|d| self.compat_dir_at(&d))
    }

    /// The directory `dir` of the image and the regular files in it, if it exists.
    pub fn compat_dir_at(&self, dir: &str) -> Option<CompatDir> {
        let handle = self.dir_if_exists(dir).ok()?;
        let names = match sys::dir_names(handle.as_fd(), MAX_ENTRIES) {
            Ok(names) => names,
            Err(e) => {
                tracing::info!(dir, error = %e, "CUDA compat directory not read: the host's libraries");
                return None;
            }
        };
        let files = names
            .iter()
            .filter(|name| {
                sys::lstat_at(handle.as_fd(), name)
                    .ok()
                    .flatten()
                    .is_some_and(|st| sys::file_type(&st) == libc::S_IFREG)
            })
            .filter_map(|name| name.to_str().ok().map(str::to_string))
            .collect();
        Some(CompatDir {
            dir: dir.to_string(),
            files,
        })
    }

    /// The description of the note owned by `owner` in the ELF section `section` of the
    /// image's regular file `path`, if it has one.
    pub fn elf_note(&self, path: &str, (section, owner): (&str, &str)) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let (file, _) = self.open_regular(path).ok()??;
        super::elf_note::note_description(
            &|offset, buf| file.read_exact_at(buf, offset).is_ok(),
            section,
            owner,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn only_regular_files_inside_the_root_count() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let compat = root.join("usr/local/cuda-13.0/compat");
        fs::create_dir_all(&compat).unwrap();
        fs::write(compat.join("libcuda.so.580.95.05"), b"").unwrap();
        symlink("libcuda.so.580.95.05", compat.join("libcuda.so.1")).unwrap();
        symlink("/proc/self/exe", compat.join("libnvidia-nvvm.so.580.95.05")).unwrap();
        fs::create_dir(compat.join("libnvidia-ptxjitcompiler.so.580.95.05")).unwrap();
        let r = Rootfs::open(&root).unwrap();
        // No /usr/local/cuda and no CUDA_VERSION: not looked for elsewhere.
        assert_eq!(r.cuda_compat(None), None);
        let found = r.cuda_compat(Some("13.0.1")).unwrap();
        assert_eq!(found.dir, "/usr/local/cuda-13.0/compat");
        assert_eq!(found.files, ["libcuda.so.580.95.05"]);
        // /usr/local/cuda, a link (absolute, as the alternatives system makes it), wins.
        symlink("/usr/local/cuda-13.0", root.join("usr/local/cuda")).unwrap();
        let r = Rootfs::open(&root).unwrap();
        assert_eq!(
            r.cuda_compat(Some("12.4")).unwrap().dir,
            "/usr/local/cuda/compat"
        );
    }

    #[test]
    fn a_link_out_of_the_root_resolves_inside_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let host = tmp.path().join("host-compat");
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("libcuda.so.999.0.0"), b"").unwrap();
        fs::create_dir_all(root.join("usr/local/cuda")).unwrap();
        symlink(&host, root.join("usr/local/cuda/compat")).unwrap();
        let r = Rootfs::open(&root).unwrap();
        // Inside the root the link names root/<host path>, which is not there.
        assert_eq!(r.cuda_compat(None), None);
        let inside = root.join(host.strip_prefix("/").unwrap());
        fs::create_dir_all(&inside).unwrap();
        fs::write(inside.join("libcuda.so.600.1.2"), b"").unwrap();
        let r = Rootfs::open(&root).unwrap();
        assert_eq!(r.cuda_compat(None).unwrap().files, ["libcuda.so.600.1.2"]);
    }
}
