//! cgroup v2: widen the runtime's BPF device program by replacing it with an extended copy.
//!
//! Attaching a second program cannot widen access (every attached program must allow),
//! so each attached program is read back, prefixed with allow blocks for the rules,
//! loaded (or taken from the programs kept for earlier containers), attached, and the old one
//! detached. The bpf(2) calls are behind [`Programs`], so that order and its undo are
//! unit-tested without a kernel.

use super::bpf::{self, insn::Insn, kept::KeptPrograms, sys};
use super::{CgroupError, DeviceRule};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// `kept`: the bpffs directory where programs are kept between containers, if any.
pub(super) fn allow(
    dir: &Path,
    rules: &[DeviceRule],
    kept: Option<&Path>,
) -> Result<(), CgroupError> {
    if rules.is_empty() {
        return Ok(());
    }
    let cgroup = bpf::open_cgroup(dir)?;
    let attached = sys::query_device_programs(cgroup.as_fd())?;
    if attached.ids.is_empty() {
        tracing::debug!(
            cgroup = %dir.display(),
            "no device program attached: cgroup v2 already allows every device, nothing to do"
        );
        return Ok(());
    }
    let mut kernel = Kernel {
        cgroup: cgroup.as_fd(),
        kept: kept.and_then(KeptPrograms::open),
    };
    for &id in &attached.ids {
        replace(&mut kernel, dir, id, attached.flags, rules)?;
    }
    Ok(())
}

/// The device-program operations on one cgroup that a replacement needs.
trait Programs {
    type Program;
    /// The attached program `id`, with its instructions.
    fn read(&mut self, id: u32) -> Result<(Self::Program, Vec<Insn>), CgroupError>;
    fn load(&mut self, dir: &Path, insns: &[Insn]) -> Result<Self::Program, CgroupError>;
    /// A program kept from an earlier container, loaded from `insns`.
    fn kept(&mut self, insns: &[Insn]) -> Option<Self::Program>;
    /// Keeps `program`, loaded from `insns`, for later containers; best effort.
    fn keep(&mut self, insns: &[Insn], program: &Self::Program);
    fn attach(&mut self, program: &Self::Program, flags: u32) -> Result<(), CgroupError>;
    fn detach(&mut self, program: &Self::Program) -> Result<(), CgroupError>;
}

/// bpf(2) on a cgroup directory.
struct Kernel<'a> {
    cgroup: BorrowedFd<'a>,
    kept: Option<KeptPrograms>,
}

impl Programs for Kernel<'_> {
    type Program = OwnedFd;

    fn read(&mut self, id: u32) -> Result<(OwnedFd, Vec<Insn>), CgroupError> {
        let program = sys::program_by_id(id)?;
        let insns = sys::program_instructions(program.as_fd())?;
        Ok((program, insns))
    }

    fn load(&mut self, dir: &Path, insns: &[Insn]) -> Result<OwnedFd, CgroupError> {
        sys::load_device_program(insns).map_err(|e| CgroupError::Rejected {
            path: dir.to_owned(),
            source: e.source,
            log: e.log,
        })
    }

    fn kept(&mut self, insns: &[Insn]) -> Option<OwnedFd> {
        self.kept.as_ref()?.get(insns)
    }

    fn keep(&mut self, insns: &[Insn], program: &OwnedFd) {
        if let Some(kept) = &self.kept {
            kept.keep(insns, program.as_fd());
        }
    }

    fn attach(&mut self, program: &OwnedFd, flags: u32) -> Result<(), CgroupError> {
        sys::attach_device_program(self.cgroup, program.as_fd(), flags)
    }

    fn detach(&mut self, program: &OwnedFd) -> Result<(), CgroupError> {
        sys::detach_device_program(self.cgroup, program.as_fd())
    }
}

fn replace<P: Programs>(
    programs: &mut P,
    dir: &Path,
    old_id: u32,
    flags: u32,
    rules: &[DeviceRule],
) -> Result<(), CgroupError> {
    let (old, original) = programs.read(old_id)?;
    let extended = bpf::extend(rules, &original).map_err(|reason| CgroupError::Unsupported {
        id: old_id,
        path: dir.to_owned(),
        reason,
    })?;
    let (new, reused) = match programs.kept(&extended) {
        Some(kept) => (kept, true),
        None => {
            let new = programs.load(dir, &extended)?;
            programs.keep(&extended, &new);
            (new, false)
        }
    };
    // Without ALLOW_MULTI a cgroup holds one program, and attaching with the same flags
    // swaps it atomically. With it, attach before detaching: while both run, both must
    // allow, so access never exceeds the final state.
    programs.attach(&new, flags)?;
    if flags & sys::BPF_F_ALLOW_MULTI != 0
        && let Err(e) = programs.detach(&old)
    {
        // Leave the cgroup as the runtime set it rather than with two programs.
        let _ = programs.detach(&new);
        return Err(e);
    }
    tracing::debug!(
        cgroup = %dir.display(),
        old_id,
        original_insns = original.len(),
        rules = rules.len(),
        reused,
        "replaced device program with one that also allows the GPU devices"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::interp::runc_program;
    use crate::{DeviceKind, DeviceRule};

    /// Programs by number: 1 is the runtime's, 2 and up the replacements loaded.
    #[derive(Default)]
    struct Recorded {
        attached: Vec<u32>,
        calls: Vec<String>,
        fail: Option<&'static str>,
        loaded: u32,
        kept: Vec<(Vec<Insn>, u32)>,
    }

    impl Recorded {
        fn call(&mut self, what: String) -> Result<(), CgroupError> {
            let failing = self.fail.is_some_and(|f| what.starts_with(f));
            self.calls.push(what);
            match failing {
                true => Err(CgroupError::Bpf {
                    cmd: "test",
                    source: std::io::Error::from_raw_os_error(libc::EPERM),
                }),
                false => Ok(()),
            }
        }
    }

    impl Programs for Recorded {
        type Program = u32;

        fn read(&mut self, id: u32) -> Result<(u32, Vec<Insn>), CgroupError> {
            self.call(format!("read {id}"))?;
            Ok((
                id,
                runc_program(&[(DeviceKind::Char, Some(1), Some(3), "rwm")], false),
            ))
        }

        fn load(&mut self, _: &Path, _: &[Insn]) -> Result<u32, CgroupError> {
            self.call("load".into())?;
            self.loaded += 1;
            Ok(1 + self.loaded)
        }

        fn kept(&mut self, insns: &[Insn]) -> Option<u32> {
            let &(_, program) = self.kept.iter().find(|(kept, _)| kept == insns)?;
            self.calls.push(format!("reuse {program}"));
            Some(program)
        }

        fn keep(&mut self, insns: &[Insn], program: &u32) {
            self.calls.push(format!("keep {program}"));
            self.kept.push((insns.to_vec(), *program));
        }

        fn attach(&mut self, program: &u32, _: u32) -> Result<(), CgroupError> {
            self.call(format!("attach {program}"))?;
            self.attached.push(*program);
            Ok(())
        }

        fn detach(&mut self, program: &u32) -> Result<(), CgroupError> {
            self.call(format!("detach {program}"))?;
            self.attached.retain(|p| p != program);
            Ok(())
        }
    }

    fn replace_runtimes(fail: Option<&'static str>, flags: u32) -> (Recorded, bool) {
        let mut recorded = Recorded {
            attached: vec![1],
            fail,
            ..Recorded::default()
        };
        let rules = [DeviceRule::char_rw(195, 0)];
        let ok = replace(&mut recorded, Path::new("/cg"), 1, flags, &rules).is_ok();
        (recorded, ok)
    }

    #[test]
    fn the_new_program_is_attached_before_the_old_one_goes() {
        let (r, ok) = replace_runtimes(None, sys::BPF_F_ALLOW_MULTI);
        assert!(ok);
        assert_eq!(
            r.calls,
            ["read 1", "load", "keep 2", "attach 2", "detach 1"]
        );
        assert_eq!(r.attached, [2]);
    }

    /// The same runtime program and rules: the program kept from the first cgroup serves the
    /// second; other rules get a program of their own.
    #[test]
    fn a_program_kept_for_the_same_rules_is_attached_instead_of_loading() {
        let mut r = Recorded {
            attached: vec![1],
            ..Recorded::default()
        };
        let gpu0 = [DeviceRule::char_rw(195, 0)];
        let gpu1 = [DeviceRule::char_rw(195, 1)];
        let multi = sys::BPF_F_ALLOW_MULTI;
        replace(&mut r, Path::new("/cg/a"), 1, multi, &gpu0).unwrap();
        r.attached = vec![1];
        replace(&mut r, Path::new("/cg/b"), 1, multi, &gpu0).unwrap();
        assert_eq!(r.attached, [2], "the kept program, attached again");
        r.attached = vec![1];
        replace(&mut r, Path::new("/cg/c"), 1, multi, &gpu1).unwrap();
        assert_eq!(r.attached, [3]);
        assert_eq!(
            r.calls,
            [
                "read 1", "load", "keep 2", "attach 2", "detach 1", // a
                "read 1", "reuse 2", "attach 2", "detach 1", // b
                "read 1", "load", "keep 3", "attach 3", "detach 1", // c
            ]
        );
    }

    #[test]
    fn without_allow_multi_the_attach_swaps_and_nothing_is_detached() {
        let (r, ok) = replace_runtimes(None, 0);
        assert!(ok);
        assert_eq!(r.calls, ["read 1", "load", "keep 2", "attach 2"]);
    }

    #[test]
    fn a_failed_detach_takes_the_new_program_out_again() {
        let (r, ok) = replace_runtimes(Some("detach 1"), sys::BPF_F_ALLOW_MULTI);
        assert!(!ok);
        assert_eq!(
            r.calls,
            [
                "read 1", "load", "keep 2", "attach 2", "detach 1", "detach 2"
            ]
        );
        assert_eq!(r.attached, [1], "the runtime's program alone, as it set it");
    }

    #[test]
    fn a_failed_load_or_attach_leaves_the_runtimes_program_alone() {
        for fail in ["load", "attach 2"] {
            let (r, ok) = replace_runtimes(Some(fail), sys::BPF_F_ALLOW_MULTI);
            assert!(!ok);
            assert_eq!(r.attached, [1], "failing {fail}");
            assert!(
                !r.calls.iter().any(|c| c.starts_with("detach")),
                "{:?}",
                r.calls
            );
        }
    }
}
