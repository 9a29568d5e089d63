//! The bpf(2) commands a device program swap needs, over raw `syscall(SYS_bpf)`.
//!
//! `union bpf_attr` is built as a zeroed, full-size byte buffer with fields written at
//! their uapi offsets: the kernel ignores zero tails, and since 6.17 `BPF_PROG_QUERY`
//! writes its `revision` field whatever size we pass, so the buffer must be that big.

use super::insn::{Insn, decode_program, encode_program};
use crate::CgroupError;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;

pub(crate) const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
pub const BPF_F_ALLOW_MULTI: u32 = 2;

/// The most programs one cgroup attach point holds (BPF_CGROUP_MAX_PROGS).
const MAX_PROGS: usize = 64;
/// runc and crun load their device programs under this license; we keep theirs.
const LICENSE: &[u8] = b"Apache\0";
/// Shows up in `bpftool prog show`, so an operator can tell whose program this is.
const PROG_NAME: &[u8] = b"nvhook_devices";
const VERIFIER_LOG_SIZE: usize = 64 * 1024;

/// `union bpf_attr`, larger than any kernel's so far (about 150 bytes in 6.18).
#[repr(C, align(8))]
struct Attr([u8; 256]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 256])
    }

    fn set_u32(&mut self, offset: usize, value: u32) -> &mut Attr {
        self.0[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
        self
    }

    fn set_u64(&mut self, offset: usize, value: u64) -> &mut Attr {
        self.0[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
        self
    }

    fn set_ptr<T>(&mut self, offset: usize, ptr: *const T) -> &mut Attr {
        self.set_u64(offset, ptr as u64)
    }

    fn get_u32(&self, offset: usize) -> u32 {
        u32::from_ne_bytes(self.0[offset..offset + 4].try_into().expect("4 bytes"))
    }
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    fd.as_raw_fd() as u32
}

fn sys_bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, writable buffer of the size passed; every pointer stored
    // in it refers to memory the caller keeps alive and large enough for this call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            std::mem::size_of::<Attr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Runs one command; `name` goes into the error.
fn bpf(
    cmd: libc::c_long,
    name: &'static str,
    attr: &mut Attr,
) -> Result<libc::c_long, CgroupError> {
    sys_bpf(cmd, attr).map_err(|source| CgroupError::Bpf { cmd: name, source })
}

/// Takes ownership of an fd bpf(2) returned.
fn owned_fd(raw: libc::c_long) -> io::Result<OwnedFd> {
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    off_stdin(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// Moves an fd off 0: several bpf_attr fields treat fd 0 as "no fd", and 0 is what a new
/// fd gets whenever the caller closed stdin.
pub(crate) fn off_stdin(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() != 0 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a valid fd has no memory effects.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl returned a new fd that only we own; fd 0 closes when `fd` drops.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// What is attached to a cgroup's device hook: the attach flags and the program ids.
pub(crate) struct Attached {
    pub flags: u32,
    pub ids: Vec<u32>,
}

/// BPF_PROG_QUERY for the programs attached directly to `cgroup` (not inherited ones).
pub(crate) fn query_device_programs(cgroup: BorrowedFd<'_>) -> Result<Attached, CgroupError> {
    let mut ids = vec![0u32; MAX_PROGS];
    let mut attr = Attr::new();
    attr.set_u32(0, fd_u32(cgroup)) // target_fd
        .set_u32(4, BPF_CGROUP_DEVICE) // attach_type
        .set_ptr(16, ids.as_mut_ptr()) // prog_ids
        .set_u32(24, MAX_PROGS as u32); // prog_cnt
    bpf(BPF_PROG_QUERY, "BPF_PROG_QUERY", &mut attr)?;
    ids.truncate((attr.get_u32(24) as usize).min(MAX_PROGS));
    Ok(Attached {
        flags: attr.get_u32(12),
        ids,
    })
}

pub(crate) fn program_by_id(id: u32) -> Result<OwnedFd, CgroupError> {
    let mut attr = Attr::new();
    attr.set_u32(0, id);
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, "BPF_PROG_GET_FD_BY_ID", &mut attr)?;
    owned_fd(fd).map_err(|source| CgroupError::Bpf {
        cmd: "BPF_PROG_GET_FD_BY_ID",
        source,
    })
}

/// The leading part of `struct bpf_prog_info` that we read: type .. xlated_prog_insns.
const PROG_INFO_LEN: usize = 40;

fn prog_info(prog: BorrowedFd<'_>, insns: &mut [u8]) -> Result<[u8; PROG_INFO_LEN], CgroupError> {
    let mut info = [0u8; PROG_INFO_LEN];
    info[20..24].copy_from_slice(&(insns.len() as u32).to_ne_bytes()); // xlated_prog_len
    info[32..40].copy_from_slice(&(insns.as_mut_ptr() as u64).to_ne_bytes()); // xlated_prog_insns
    let mut attr = Attr::new();
    attr.set_u32(0, fd_u32(prog)) // bpf_fd
        .set_u32(4, PROG_INFO_LEN as u32) // info_len
        .set_ptr(8, info.as_mut_ptr()); // info
    bpf(BPF_OBJ_GET_INFO_BY_FD, "BPF_OBJ_GET_INFO_BY_FD", &mut attr)?;
    Ok(info)
}

fn info_u32(info: &[u8; PROG_INFO_LEN], at: usize) -> u32 {
    u32::from_ne_bytes(info[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn program_id(prog: BorrowedFd<'_>) -> Result<u32, CgroupError> {
    Ok(info_u32(&prog_info(prog, &mut [])?, 4))
}

/// The program's instructions as the kernel holds them after verification.
pub(crate) fn program_instructions(prog: BorrowedFd<'_>) -> Result<Vec<Insn>, CgroupError> {
    program_listing(prog).map(|(_, insns)| insns)
}

/// The program's type (BPF_PROG_TYPE_*) and its instructions after verification.
pub(crate) fn program_listing(prog: BorrowedFd<'_>) -> Result<(u32, Vec<Insn>), CgroupError> {
    let info = prog_info(prog, &mut [])?;
    let mut bytes = vec![0u8; info_u32(&info, 20) as usize];
    let info = prog_info(prog, &mut bytes)?;
    bytes.truncate(info_u32(&info, 20) as usize);
    Ok((info_u32(&info, 0), decode_program(&bytes)))
}

/// BPF_OBJ_PIN: `prog` stays loaded, under `path` in a bpffs, until that file is removed.
pub(crate) fn pin(prog: BorrowedFd<'_>, path: &CStr) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.set_ptr(0, path.as_ptr()) // pathname
        .set_u32(8, fd_u32(prog)); // bpf_fd
    sys_bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// BPF_OBJ_GET: the object pinned at `path` in a bpffs.
pub(crate) fn pinned(path: &CStr) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.set_ptr(0, path.as_ptr()); // pathname
    owned_fd(sys_bpf(BPF_OBJ_GET, &mut attr)?)
}

/// The failure of a BPF_PROG_LOAD, with the last lines of the verifier's log.
pub(crate) struct LoadError {
    pub source: io::Error,
    pub log: String,
}

fn load_attr(code: &[u8], log: &mut [u8]) -> Attr {
    let mut name = [0u8; 16];
    name[..PROG_NAME.len()].copy_from_slice(PROG_NAME);
    let mut attr = Attr::new();
    attr.set_u32(0, BPF_PROG_TYPE_CGROUP_DEVICE) // prog_type
        .set_u32(4, (code.len() / Insn::SIZE) as u32) // insn_cnt
        .set_ptr(8, code.as_ptr()) // insns
        .set_ptr(16, LICENSE.as_ptr()); // license
    if !log.is_empty() {
        attr.set_u32(24, 1) // log_level
            .set_u32(28, log.len() as u32) // log_size
            .set_ptr(32, log.as_mut_ptr()); // log_buf
    }
    attr.0[48..64].copy_from_slice(&name); // prog_name
    attr
}

/// Loads a BPF_PROG_TYPE_CGROUP_DEVICE program.
pub(crate) fn load_device_program(insns: &[Insn]) -> Result<OwnedFd, LoadError> {
    let code = encode_program(insns);
    // Without a log first: verifier logging is slow, and only a failure needs it.
    let first = match sys_bpf(BPF_PROG_LOAD, &mut load_attr(&code, &mut [])) {
        Ok(fd) => {
            return owned_fd(fd).map_err(|source| LoadError {
                source,
                log: String::new(),
            });
        }
        Err(first) => first,
    };
    let mut log = vec![0u8; VERIFIER_LOG_SIZE];
    match sys_bpf(BPF_PROG_LOAD, &mut load_attr(&code, &mut log)) {
        // The first failure was transient (EAGAIN from an interrupted verifier).
        Ok(fd) => owned_fd(fd).map_err(|source| LoadError {
            source,
            log: String::new(),
        }),
        Err(_) => Err(LoadError {
            source: first,
            log: last_log_lines(&log),
        }),
    }
}

/// The end of a verifier log, where the reason is, on one line.
fn last_log_lines(log: &[u8]) -> String {
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let tail = &lines[lines.len().saturating_sub(2)..];
    if tail.is_empty() {
        "(no log)".to_owned()
    } else {
        tail.join(" / ")
    }
}

pub(crate) fn attach_device_program(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    flags: u32,
) -> Result<(), CgroupError> {
    let mut attr = Attr::new();
    attr.set_u32(0, fd_u32(cgroup)) // target_fd
        .set_u32(4, fd_u32(prog)) // attach_bpf_fd
        .set_u32(8, BPF_CGROUP_DEVICE) // attach_type
        .set_u32(12, flags); // attach_flags
    bpf(BPF_PROG_ATTACH, "BPF_PROG_ATTACH", &mut attr).map(drop)
}

pub(crate) fn detach_device_program(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
) -> Result<(), CgroupError> {
    let mut attr = Attr::new();
    attr.set_u32(0, fd_u32(cgroup)) // target_fd
        .set_u32(4, fd_u32(prog)) // attach_bpf_fd
        .set_u32(8, BPF_CGROUP_DEVICE); // attach_type
    bpf(BPF_PROG_DETACH, "BPF_PROG_DETACH", &mut attr).map(drop)
}

/// What to check when a bpf command fails, by command and errno.
pub(crate) fn hint(cmd: &str, error: &io::Error) -> &'static str {
    match (cmd, error.raw_os_error()) {
        (_, Some(libc::ENOSYS)) => {
            "this kernel has no bpf(2): is it built with CONFIG_BPF_SYSCALL?"
        }
        (_, Some(libc::EPERM | libc::EACCES)) => {
            "needs root (CAP_SYS_ADMIN) in the host user namespace, and on kernels before 5.11 a large enough RLIMIT_MEMLOCK"
        }
        ("BPF_PROG_QUERY" | "BPF_PROG_ATTACH" | "BPF_PROG_DETACH", Some(libc::EINVAL)) => {
            "is this kernel built with CONFIG_CGROUP_BPF, and is the target a cgroup2 directory?"
        }
        ("BPF_PROG_GET_FD_BY_ID", Some(libc::ENOENT)) => {
            "the program went away meanwhile: is the runtime updating the container's cgroup concurrently?"
        }
        _ => "see bpf(2)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_log_tail_is_one_line() {
        let log = b"0: (61) r2 = *(u32 *)(r1 +0)\n\n1: (95) exit\nR0 !read_ok\nprocessed 2 insns\n\0garbage";
        assert_eq!(last_log_lines(log), "R0 !read_ok / processed 2 insns");
        assert_eq!(last_log_lines(b"\0"), "(no log)");
    }

    #[test]
    fn hints_name_the_likely_cause() {
        let einval = io::Error::from_raw_os_error(libc::EINVAL);
        assert!(hint("BPF_PROG_QUERY", &einval).contains("CONFIG_CGROUP_BPF"));
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        assert!(hint("BPF_PROG_LOAD", &eperm).contains("root"));
    }

    #[test]
    fn load_attr_puts_fields_at_uapi_offsets() {
        let code = encode_program(&[Insn::exit()]);
        let attr = load_attr(&code, &mut []);
        assert_eq!(attr.get_u32(0), BPF_PROG_TYPE_CGROUP_DEVICE);
        assert_eq!(attr.get_u32(4), 1);
        assert_eq!(attr.get_u32(24), 0, "no log level without a log buffer");
        assert_eq!(&attr.0[48..62], PROG_NAME);
    }
}
