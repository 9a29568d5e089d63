//! An image's own `libcuda.so.1` that the loader finds before the host's: a directory in the
//! image's `LD_LIBRARY_PATH` (searched before the loader cache nvhook writes) holding one, a
//! stale copy, a CUDA stub made loadable, an older compat library. `cuInit` then fails
//! (CUDA_ERROR_UNKNOWN, or 34 for a stub) while `nvidia-smi` works: the most reported failure
//! of GPU containers. Only `nvhook plan` looks, so no start pays for it.

use super::Plan;

const LIBCUDA: &str = "libcuda.so.1";

/// The library file the loader would take instead of the host's, and the directory of
/// `LD_LIBRARY_PATH` that leads it there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Shadow {
    pub path: String,
    pub dir: String,
}

impl std::fmt::Display for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the image's own {} is loaded instead of the host's libcuda: LD_LIBRARY_PATH lists {}, which the loader searches before its cache, so cuInit fails (CUDA_ERROR_UNKNOWN, or 34 for a stub) while nvidia-smi works (remove that file from the image, or {} from LD_LIBRARY_PATH)",
            self.path, self.dir, self.dir
        )
    }
}

/// The first `libcuda.so.1` in `ld_library_path`'s directories, as the loader walks them,
/// unless that first one is the plan's own (the host's, or the image's compat library the
/// plan chose). `exists` says whether the image has a loadable file at a path.
pub fn shadowing_libcuda(
    plan: &Plan,
    ld_library_path: Option<&str>,
    exists: impl Fn(&str) -> bool,
) -> Option<Shadow> {
    let planned = |path: &str| {
        plan.ldcache
            .iter()
            .any(|e| e.soname == LIBCUDA && e.path == path)
            || plan.symlinks.iter().any(|l| l.path == path)
            || plan.mounts.iter().any(|m| m.destination == path)
            || plan
                .cuda_compat
                .as_ref()
                .is_some_and(|c| c.used() && path == format!("{}/{LIBCUDA}", c.dir))
    };
    // glibc splits the list at ':' and ';'; an empty entry is the working directory, and
    // `$ORIGIN`-style tokens depend on the program: neither is the image's to judge here.
    for dir in ld_library_path?.split([':', ';']) {
        let dir = dir.trim_end_matches('/');
        if !dir.starts_with('/') || dir.contains('$') {
            continue;
        }
        let path = format!("{dir}/{LIBCUDA}");
        if planned(&path) {
            return None;
        }
        if exists(&path) {
            return Some(Shadow {
                path,
                dir: dir.to_string(),
            });
        }
    }
    None
}
