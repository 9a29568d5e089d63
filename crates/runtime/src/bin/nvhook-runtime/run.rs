//! nvhook-runtime's decisions, on the process's own argv, environment and files.

use crate::sys;
use nvhook_runtime::{self as front, Invocation, Runtimes, ServerSocket, server};

const PATH_MAX: usize = 4096;
const ENOENT: isize = 2;

pub fn main(argc: usize, argv: *mut *const u8, envp: *const *const u8) -> ! {
    // As nvhook's own entry does: closed standard descriptors are reopened on /dev/null,
    // and the runtime gets SIGPIPE's default.
    for fd in 0..3 {
        if sys::is_closed(fd) && sys::open_dev_null() != fd as isize {
            sys::exit(127);
        }
    }
    sys::default_sigpipe();
    // SAFETY: the kernel's argv has argc valid C strings.
    let args = (1..argc).map(|i| unsafe { c_bytes(*argv.add(i)) });
    let invocation = Invocation::parse(args);
    let mut buf = [0u8; PATH_MAX];
    let gpu_create = invocation.creates() && may_ask_for_gpu(&mut buf, invocation.bundle);
    if let Some(config) = read_config(&mut buf, envp)
        && let Some(runtime) = find_runtime(&mut buf, config.text, envp)
        && (!gpu_create || prepared_by_server(&config, argc, argv))
    {
        // SAFETY: argv[0] is ours to replace; `runtime` is NUL-terminated and lives until exec.
        unsafe {
            *argv = runtime.as_ptr();
            sys::execve(runtime, argv, envp);
        }
        // The runtime could not be executed: nvhook says why, in its words.
    }
    hand_to_nvhook(&mut buf, argc, argv, envp)
}

/// Whether the bundle's config.json may ask for a GPU; one that cannot be read is nvhook's
/// to report.
fn may_ask_for_gpu(buf: &mut [u8], bundle: Option<&[u8]>) -> bool {
    let Some(path) = front::join_path(buf, bundle.unwrap_or(b"."), b"config.json") else {
        return true;
    };
    sys::map_file(path).map_or(true, front::may_ask_for_gpu)
}

/// nvhook's config, as nvhook would read it.
struct NodeConfig {
    /// NVHOOK_CONFIG, when set.
    named: Option<&'static [u8]>,
    text: &'static [u8],
}

/// `None` when the file cannot be read: that is nvhook's to report.
fn read_config(buf: &mut [u8], envp: *const *const u8) -> Option<NodeConfig> {
    // Set but empty names no file, as in nvhook: that error is nvhook's to report.
    let named = env(envp, front::CONFIG_ENV.as_bytes());
    let config = named.unwrap_or(front::DEFAULT_CONFIG.as_bytes());
    let text = match sys::map_file(front::join_path(buf, b"", config)?) {
        Ok(text) => text,
        // No file at the default place is the default config.
        Err(ENOENT) if named.is_none() => b"",
        Err(_) => return None,
    };
    Some(NodeConfig { named, text })
}

/// The first of the config's `runtimes` that is an executable file (absolute, or on PATH),
/// NUL-terminated in `buf`; `None` when that is not certain.
fn find_runtime<'b>(buf: &'b mut [u8], config: &[u8], envp: *const *const u8) -> Option<&'b [u8]> {
    let search = env(envp, b"PATH").unwrap_or(front::DEFAULT_SEARCH_PATH);
    let found = match front::runtimes_in_toml(config) {
        Runtimes::Default => front::DEFAULT_RUNTIMES
            .iter()
            .any(|name| locate(buf, name.as_bytes(), search)),
        Runtimes::Listed(inner) => {
            front::array_strings(inner).any(|name| locate(buf, name, search))
        }
        Runtimes::Unsure => false,
    };
    let len = buf.iter().position(|&c| c == 0)?;
    found.then_some(&buf[..=len])
}

/// Whether `nvhook runtime-server` prepared the bundle of this GPU create; false when no
/// server listens or it cannot answer for this create (nvhook then prepares it). A refusal
/// is reported as nvhook would, and so is a server that took the request and gave no answer:
/// it may have changed the bundle, so nothing else may prepare it again.
fn prepared_by_server(config: &NodeConfig, argc: usize, argv: *const *const u8) -> bool {
    let named = match front::server_socket_in_toml(config.text) {
        ServerSocket::Default => server::DEFAULT_SOCKET.as_bytes(),
        ServerSocket::Named(path) if !path.is_empty() => path,
        ServerSocket::Named(_) | ServerSocket::Unsure => return false,
    };
    let mut socket = [0u8; PATH_MAX];
    let mut exe = [0u8; PATH_MAX];
    let mut nvhook = [0u8; PATH_MAX];
    let mut request = [0u8; server::MAX_REQUEST];
    let (Some(socket), Some(nvhook)) = (
        front::join_path(&mut socket, b"", named),
        nvhook_beside(&mut exe, &mut nvhook),
    ) else {
        return false;
    };
    // SAFETY: the kernel's argv has argc valid C strings.
    let args = (1..argc).map(|i| unsafe { c_bytes(*argv.add(i)) });
    let nvhook = &nvhook[..nvhook.len() - 1];
    let Some(request) = server::Request::encode(&mut request, nvhook, config.named, args) else {
        return false;
    };
    let Ok(sock) = sys::connect_unix(socket) else {
        return false;
    };
    let cwd = sys::open_cwd();
    let sent = if cwd < 0 {
        cwd
    } else {
        let sent = sys::send_with_fd(sock, request, cwd as usize);
        sys::close(cwd as usize);
        sent
    };
    // A message not sent is one the server never saw.
    if sent != request.len() as isize {
        sys::close(sock);
        return false;
    }
    let mut reply = [0u8; 4096];
    let n = sys::recv_within(sock, &mut reply, server::REPLY_TIMEOUT_S);
    sys::close(sock);
    if n <= 0 {
        fail(
            socket,
            b"gave no answer: see nvhook runtime-server's log",
            -n,
        )
    }
    match &reply[..n as usize] {
        server::DONE => true,
        server::PASS => false,
        reply => match reply.strip_prefix(server::FAILED) {
            Some(line) => {
                sys::write_all(2, b"nvhook-runtime: ");
                sys::write_all(2, line);
                sys::write_all(2, b"\n");
                sys::exit(1)
            }
            None => fail(
                socket,
                b"gave an answer this nvhook-runtime cannot read: install the same version of both",
                0,
            ),
        },
    }
}

/// Whether `name` is an executable file, absolute or in one of `search`'s directories; its
/// path is left in `buf`, NUL-terminated.
fn locate(buf: &mut [u8], name: &[u8], search: &[u8]) -> bool {
    if name.first() == Some(&b'/') {
        return front::join_path(buf, b"", name).is_some_and(is_executable);
    }
    search
        .split(|&c| c == b':')
        .any(|dir| front::join_path(buf, dir, name).is_some_and(is_executable))
}

fn is_executable(path: &[u8]) -> bool {
    sys::stat(path).is_some_and(|st| st.mode & sys::S_IFMT == sys::S_IFREG && st.mode & 0o111 != 0)
}

/// Execs `nvhook runtime ARGS...`, nvhook being the binary beside this one.
fn hand_to_nvhook(buf: &mut [u8], argc: usize, argv: *mut *const u8, envp: *const *const u8) -> ! {
    let mut exe = [0u8; PATH_MAX];
    let Some(nvhook) = nvhook_beside(&mut exe, buf) else {
        fail(b"/proc/self/exe", b"cannot be read: mount /proc", 0)
    };
    let mut subcommand = [0u8; 16];
    let subcommand = front::join_path(&mut subcommand, b"", front::CREATE_SUBCOMMAND.as_bytes());
    let (Some(args), Some(subcommand)) = (sys::map_pointers(argc + 2), subcommand) else {
        fail(nvhook, b"cannot be run: out of memory", 0)
    };
    // This program's own name goes on: nvhook's errors then name the program the engine ran.
    args[0] = match argc {
        0 => nvhook.as_ptr(),
        // SAFETY: the kernel's argv has argc entries.
        _ => unsafe { *argv },
    };
    args[1] = subcommand.as_ptr();
    for i in 1..argc {
        // SAFETY: the kernel's argv has argc entries.
        args[i + 1] = unsafe { *argv.add(i) };
    }
    // args[argc + 1] stays NULL: the mapping is zeroed.
    // SAFETY: every entry is a NUL-terminated string and the array ends with NULL.
    let errno = unsafe { sys::execve(nvhook, args.as_ptr(), envp) };
    fail(
        nvhook,
        b"cannot be run: install nvhook beside nvhook-runtime",
        -errno,
    )
}

/// The nvhook beside this program, NUL-terminated in `buf`.
fn nvhook_beside<'b>(exe: &mut [u8], buf: &'b mut [u8]) -> Option<&'b [u8]> {
    let exe = sys::own_exe(exe)?;
    let dir = &exe[..exe.iter().rposition(|&c| c == b'/')?];
    front::join_path(buf, dir, b"nvhook")
}

/// One line on stderr, as nvhook's own errors: `nvhook-runtime: PATH WHAT (errno N)`.
fn fail(path: &[u8], what: &[u8], errno: isize) -> ! {
    sys::write_all(2, b"nvhook-runtime: ");
    sys::write_all(2, path.strip_suffix(b"\0").unwrap_or(path));
    sys::write_all(2, b" ");
    sys::write_all(2, what);
    if errno > 0 {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut n = errno as usize;
        while n > 0 {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        sys::write_all(2, b" (errno ");
        sys::write_all(2, &digits[i..]);
        sys::write_all(2, b")");
    }
    sys::write_all(2, b"\n");
    sys::exit(1)
}

/// The value of `NAME=` in the environment: the first entry wins, as with getenv.
fn env(envp: *const *const u8, name: &[u8]) -> Option<&'static [u8]> {
    let mut p = envp;
    // SAFETY: envp is the kernel's NULL-terminated array of C strings.
    unsafe {
        while !(*p).is_null() {
            let kv = c_bytes(*p);
            if kv.len() > name.len() && kv.starts_with(name) && kv[name.len()] == b'=' {
                return Some(&kv[name.len() + 1..]);
            }
            p = p.add(1);
        }
    }
    None
}

/// The bytes of a C string, without its NUL.
///
/// # Safety
/// `p` points to a NUL-terminated string that lives for the rest of the process.
unsafe fn c_bytes(p: *const u8) -> &'static [u8] {
    let mut n = 0;
    // SAFETY: as the caller promises.
    unsafe {
        while *p.add(n) != 0 {
            n += 1;
        }
        core::slice::from_raw_parts(p, n)
    }
}
