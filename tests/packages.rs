//! The .deb and .rpm that `packaging/build-packages.sh` writes to
//! `<target>/packages/`: their contents and metadata, the .deb's life cycle in a
//! scratch root (install, upgrade over itself, remove, purge), and the
//! installed hook running a real runc container on a simulated node.
//!
//! Run as root after `cargo build --workspace` and `packaging/build-packages.sh`
//! (scripts/test.sh does both): `cargo test --test packages`.

use nvhook_test_support as support;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{
    Bundle, RuntimeEnv, SimNode, glibc_image, gpucheck_args, profile_dir, require_program,
    require_root, run_container, stdout_of,
};
use tempfile::TempDir;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const CONFIG: &str = "/etc/nvhook/config.toml";
const DOCKER_CONFIG: &str = "/etc/docker/daemon.json";

/// What both packages install, documentation aside.
const PROGRAM_FILES: [&str; 11] = [
    "/usr/bin/nvhook",
    "/usr/bin/nvhook-runtime",
    "/usr/bin/nvhook-nvml",
    CONFIG,
    "/usr/share/containers/oci/hooks.d/oci-nvhook-hook.json",
    "/usr/lib/systemd/system/nvhook-cdi-refresh.service",
    "/usr/lib/systemd/system/nvhook-cdi-refresh.path",
    "/usr/lib/systemd/system/nvhook-dev-char-links.service",
    // Installed, not enabled: NRI mode is the operator's switch.
    "/usr/lib/systemd/system/nvhook-nri.service",
    // Installed, not enabled: a long-running root service is the operator's switch too.
    "/usr/lib/systemd/system/nvhook-runtime-server.service",
    "/usr/lib/udev/rules.d/71-nvhook-dev-char.rules",
];

/// NVIDIA's command names, links to nvhook: files of the .deb; the .rpm's %post makes them.
const NVIDIA_NAME_LINKS: [&str; 3] = [
    "/usr/bin/nvidia-container-runtime-hook",
    "/usr/bin/nvidia-container-cli",
    "/usr/bin/nvidia-cdi-hook",
];

/// The links `systemctl enable` makes for the units a first install enables.
const ENABLED_UNITS: [&str; 3] = [
    "/etc/systemd/system/multi-user.target.wants/nvhook-cdi-refresh.path",
    "/etc/systemd/system/multi-user.target.wants/nvhook-cdi-refresh.service",
    "/etc/systemd/system/multi-user.target.wants/nvhook-dev-char-links.service",
];

/// `<target>/packages/NAME`, where build-packages.sh writes for the same
/// target directory (CARGO_TARGET_DIR or ./target) this test binary lives in.
fn package(name: &str) -> PathBuf {
    let target = profile_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .to_owned();
    let path = target.join("packages").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run packaging/build-packages.sh, and for arm64 scripts/arm64-toolchain.sh, scripts/build-arm64.sh and packaging/build-packages.sh arm64 (scripts/test.sh does all) before the package tests",
        path.display()
    );
    path
}

fn deb() -> PathBuf {
    package(&format!("nvhook_{VERSION}_amd64.deb"))
}

fn rpm() -> PathBuf {
    package(&format!("nvhook-{VERSION}-1.x86_64.rpm"))
}

/// The arm64 .deb and aarch64 .rpm, packed from the cross build (issue 29).
fn deb_arm64() -> PathBuf {
    package(&format!("nvhook_{VERSION}_arm64.deb"))
}

fn rpm_aarch64() -> PathBuf {
    package(&format!("nvhook-{VERSION}-1.aarch64.rpm"))
}

/// The maintainer script both packages carry.
fn maintainer_script(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packaging/scripts")
        .join(name);
    fs::read_to_string(&path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn lines(text: &str) -> BTreeSet<&str> {
    text.lines().filter(|line| !line.is_empty()).collect()
}

fn with_docs(docs: &[&'static str]) -> BTreeSet<&'static str> {
    PROGRAM_FILES.iter().chain(docs).copied().collect()
}

/// An empty root with the dpkg database skeleton dpkg --root needs; removed
/// when dropped.
struct ScratchRoot {
    dir: TempDir,
}

impl ScratchRoot {
    fn new() -> ScratchRoot {
        require_root();
        let dir = tempfile::Builder::new()
            .prefix("nvhook-dpkg-root-")
            .tempdir()
            .expect("create scratch root");
        let admin = dir.path().join("var/lib/dpkg");
        for sub in ["info", "updates", "triggers"] {
            fs::create_dir_all(admin.join(sub)).expect("create dpkg database dirs");
        }
        for file in ["status", "available"] {
            fs::write(admin.join(file), "").expect("create dpkg database files");
        }
        fs::create_dir_all(dir.path().join("var/log")).expect("create var/log");
        ScratchRoot { dir }
    }

    /// `path` (absolute, as on an installed system) inside the scratch root.
    fn path(&self, path: &str) -> PathBuf {
        self.dir.path().join(path.trim_start_matches('/'))
    }

    fn dpkg(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(require_program("dpkg"));
        cmd.arg("--root")
            .arg(self.dir.path())
            // dpkg.log inside the scratch root: the host's log stays untouched.
            .arg(format!(
                "--log={}",
                self.path("/var/log/dpkg.log").display()
            ))
            // The scratch root holds no shell to chroot into: the maintainer
            // scripts run on the host with DPKG_ROOT set, which they honour.
            .arg("--force-script-chrootless")
            // The Depends (libc6) is not in the scratch root's database.
            .arg("--force-depends")
            .args(args);
        cmd.output()
            .unwrap_or_else(|err| panic!("cannot spawn {cmd:?}: {err}"))
    }

    #[track_caller]
    fn dpkg_ok(&self, args: &[&str]) -> Output {
        let output = self.dpkg(args);
        assert!(
            output.status.success(),
            "dpkg {args:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
            output.status,
            text(&output.stdout),
            text(&output.stderr)
        );
        output
    }

    fn install_deb(&self) -> Output {
        self.dpkg_ok(&["--install", deb().to_str().expect("utf-8 path")])
    }

    /// dpkg's state of the package (`installed`, `config-files`), None once
    /// dpkg has forgotten it.
    fn package_state(&self) -> Option<String> {
        let output = Command::new(require_program("dpkg-query"))
            .arg(format!(
                "--admindir={}",
                self.path("/var/lib/dpkg").display()
            ))
            .args(["--show", "--showformat=${db:Status-Status}", "nvhook"])
            .output()
            .expect("spawn dpkg-query");
        output.status.success().then(|| text(&output.stdout))
    }

    /// Every file (not directory) under the root outside dpkg's own var/.
    fn files(&self) -> BTreeSet<String> {
        let listing = stdout_of(
            Command::new(require_program("find"))
                .arg(".")
                .args([
                    "-path", "./var", "-prune", "-o", "!", "-type", "d", "-print",
                ])
                .current_dir(self.dir.path()),
        );
        listing
            .lines()
            .map(|line| line.trim_start_matches('.').to_owned())
            .collect()
    }
}

// ---- the .deb ----

/// `dpkg-deb --contents` of `deb`: its listing and the files (not directories) in it.
fn deb_contents(deb: &Path) -> (String, BTreeSet<String>) {
    let listing = stdout_of(
        Command::new(require_program("dpkg-deb"))
            .arg("--contents")
            .arg(deb),
    );
    let files = listing
        .lines()
        .filter(|line| !line.ends_with('/'))
        .map(|line| line.split(" -> ").next().unwrap_or(line))
        .filter_map(|line| line.split_whitespace().last())
        .map(|path| path.trim_start_matches('.').to_owned())
        .collect();
    (listing, files)
}

/// What the .deb holds: the programs, NVIDIA's names for nvhook and the docs.
fn deb_files() -> BTreeSet<String> {
    let docs = [
        "/usr/share/doc/nvhook/README.md",
        "/usr/share/doc/nvhook/copyright",
        "/usr/share/doc/nvhook/usage.txt",
    ];
    let mut expected = with_docs(&docs);
    expected.extend(NVIDIA_NAME_LINKS);
    expected.into_iter().map(str::to_owned).collect()
}

/// `dpkg-deb --field deb NAME`.
fn deb_field(deb: &Path, name: &str) -> String {
    stdout_of(
        Command::new(require_program("dpkg-deb"))
            .arg("--field")
            .arg(deb)
            .arg(name),
    )
    .trim()
    .to_owned()
}

#[test]
fn deb_holds_the_programs_config_hook_and_docs_with_their_dependencies() {
    let deb = deb();
    let (listing, files) = deb_contents(&deb);
    assert_eq!(files, deb_files(), "{listing}");
    for link in NVIDIA_NAME_LINKS {
        assert!(
            listing
                .lines()
                .any(|line| line.ends_with(&format!(".{link} -> nvhook"))),
            "{link} is not a link to nvhook\n{listing}"
        );
    }
    for program in [
        "./usr/bin/nvhook",
        "./usr/bin/nvhook-runtime",
        "./usr/bin/nvhook-nvml",
    ] {
        let entry = listing
            .lines()
            .find(|line| line.ends_with(program))
            .unwrap_or_else(|| panic!("{program} not in the .deb\n{listing}"));
        let fields: Vec<&str> = entry.split_whitespace().collect();
        assert!(
            fields[0] == "-rwxr-xr-x" && ["0/0", "root/root"].contains(&fields[1]),
            "{program} is not root-owned mode 755: {entry}"
        );
    }

    let field = |name: &str| deb_field(&deb, name);
    assert_eq!(field("Architecture"), "amd64");
    assert_eq!(field("Version"), VERSION);
    assert!(
        field("Depends").starts_with("libc6 (>="),
        "Depends: {}",
        field("Depends")
    );
    assert_eq!(field("Recommends"), "runc | crun");
    assert_eq!(
        field("Conflicts"),
        "nvidia-container-toolkit, nvidia-container-toolkit-base, libnvidia-container-tools"
    );

    let conffiles = stdout_of(
        Command::new(require_program("dpkg-deb"))
            .arg("--info")
            .arg(&deb)
            .arg("conffiles"),
    );
    assert_eq!(lines(&conffiles), BTreeSet::from([CONFIG]));
}

#[test]
fn deb_installs_upgrades_keeping_the_config_removes_and_purges_only_its_own_files() {
    let root = ScratchRoot::new();

    let install = root.install_deb();
    assert_eq!(root.package_state().as_deref(), Some("installed"));
    assert!(
        text(&install.stdout).contains("nvhook configure docker"),
        "the first install names the configure command\n{}",
        text(&install.stdout)
    );
    let installed = root.files();
    for file in PROGRAM_FILES.iter().chain(&NVIDIA_NAME_LINKS) {
        assert!(
            installed.contains(*file),
            "{file} not installed: {installed:#?}"
        );
    }
    // Run under NVIDIA's names, the installed nvhook answers as those programs.
    for link in NVIDIA_NAME_LINKS {
        let out = Command::new(root.path(link))
            .arg("--bogus")
            .output()
            .expect("run a link");
        let name = Path::new(link).file_name().unwrap().to_string_lossy();
        assert!(
            text(&out.stderr).starts_with(&format!("nvhook (as {name}): ")),
            "{link}: {}",
            text(&out.stderr)
        );
    }
    // The first install enabled the units, with the real systemctl, in the scratch root.
    for link in ENABLED_UNITS {
        let unit = Path::new(link).file_name().unwrap();
        assert_eq!(
            fs::read_link(root.path(link)).unwrap_or_else(|e| panic!("{link}: {e}")),
            Path::new("/usr/lib/systemd/system").join(unit)
        );
    }
    assert_units_run_nvhook(&root);
    assert!(
        !root.path("/etc/docker").exists() && !root.path("/etc/containerd").exists(),
        "installing wrote an engine config"
    );
    let version = stdout_of(Command::new(root.path("/usr/bin/nvhook")).arg("--version"));
    assert_eq!(version.trim(), format!("nvhook {VERSION}"));
    // nvhook-runtime loads the shipped config and execs the runtime it finds on PATH.
    require_program("runc");
    let runtime = stdout_of(
        Command::new(root.path("/usr/bin/nvhook-runtime"))
            .env(nvhook::config::ENV_VAR, root.path(CONFIG))
            .arg("--version"),
    );
    assert!(runtime.starts_with("runc version"), "{runtime}");

    // The administrator's own setting survives a reinstall of the package.
    let config = root.path(CONFIG);
    let shipped = fs::read_to_string(&config).expect("read the installed config");
    let edited = shipped.replace("log-level = \"info\"", "log-level = \"debug\"");
    assert_ne!(
        edited, shipped,
        "the shipped config sets log-level = \"info\""
    );
    fs::write(&config, &edited).expect("edit the installed config");
    let upgrade = root.install_deb();
    assert_eq!(fs::read_to_string(&config).expect("read config"), edited);
    assert!(
        !text(&upgrade.stdout).contains("nvhook configure"),
        "an upgrade repeats the first-install hint\n{}",
        text(&upgrade.stdout)
    );
    assert_eq!(root.files(), installed, "the upgrade left extra files");

    // What the administrator made: an engine config naming the runtime, a
    // file of their own beside the package's config.
    let daemon_json = r#"{"runtimes": {"nvidia": {"path": "/usr/bin/nvhook-runtime"}}}"#;
    fs::create_dir_all(root.path("/etc/docker")).expect("mkdir etc/docker");
    fs::write(root.path(DOCKER_CONFIG), daemon_json).expect("write daemon.json");
    let notes = "/etc/nvhook/site-notes.txt";
    fs::write(root.path(notes), "ours\n").expect("write site notes");
    // And what the hook kept: NVML's answer, at the default nvml-cache-file.
    fs::create_dir_all(root.path("/run/nvhook")).expect("mkdir run/nvhook");
    fs::write(root.path("/run/nvhook/nvml-inventory.json"), "{}").expect("write NVML cache");
    // And the device programs it kept, at the default device-program-pins (on a node, pins in
    // a bpffs; here plain files standing for them).
    let pins = root.path("/sys/fs/bpf/nvhook");
    fs::create_dir_all(&pins).expect("mkdir sys/fs/bpf/nvhook");
    fs::write(pins.join("devices_0123456789abcdef_100"), "").expect("write a pin");

    let remove = root.dpkg_ok(&["--remove", "nvhook"]);
    let stderr = text(&remove.stderr);
    assert!(
        stderr.contains(DOCKER_CONFIG) && stderr.contains("nvhook configure docker --remove"),
        "removal does not name the engine config still using nvhook-runtime\n{stderr}"
    );
    assert_eq!(root.package_state().as_deref(), Some("config-files"));
    assert!(
        !root.path("/run/nvhook").exists(),
        "removal kept NVML's cache"
    );
    assert!(!pins.exists(), "removal kept the device programs");
    assert_eq!(
        root.files(),
        BTreeSet::from([
            CONFIG.to_owned(),
            DOCKER_CONFIG.to_owned(),
            notes.to_owned()
        ])
    );
    assert_eq!(fs::read_to_string(&config).expect("read config"), edited);

    root.dpkg_ok(&["--purge", "nvhook"]);
    assert_eq!(root.package_state(), None);
    assert_eq!(
        root.files(),
        BTreeSet::from([DOCKER_CONFIG.to_owned(), notes.to_owned()])
    );
    assert_eq!(
        fs::read_to_string(root.path(DOCKER_CONFIG)).expect("read daemon.json"),
        daemon_json,
        "purge touched the engine config"
    );
}

/// What the installed units and udev rule run, and when: the commands nvhook has.
fn assert_units_run_nvhook(root: &ScratchRoot) {
    let read = |path: &str| fs::read_to_string(root.path(path)).unwrap();
    let refresh = read("/usr/lib/systemd/system/nvhook-cdi-refresh.service");
    assert!(
        refresh.contains("\nExecStart=/usr/bin/nvhook cdi refresh\n"),
        "{refresh}"
    );
    assert!(
        refresh.contains("After=systemd-modules-load.service"),
        "{refresh}"
    );
    assert!(refresh.contains("Before=containerd.service"), "{refresh}");
    let path = read("/usr/lib/systemd/system/nvhook-cdi-refresh.path");
    assert!(
        path.contains("\nUnit=nvhook-cdi-refresh.service\n"),
        "{path}"
    );
    // Both architectures' library directories, on the host and in the GPU operator's driver
    // root: one unit file for amd64 and arm64 nodes.
    for arch in ["x86_64", "aarch64"] {
        for root in ["", "/run/nvidia/driver"] {
            let watched =
                format!("PathChanged={root}/usr/lib/{arch}-linux-gnu/libnvidia-ml.so.1\n");
            assert!(path.contains(&watched), "{watched}{path}");
        }
    }
    let server = read("/usr/lib/systemd/system/nvhook-runtime-server.service");
    assert!(
        server.contains("\nExecStart=/usr/bin/nvhook runtime-server\n")
            && server.contains("Before=containerd.service docker.service"),
        "{server}"
    );
    let links = read("/usr/lib/systemd/system/nvhook-dev-char-links.service");
    assert!(
        links.contains("\nExecStart=/usr/bin/nvhook dev-char-links\n"),
        "{links}"
    );
    let rule = read("/usr/lib/udev/rules.d/71-nvhook-dev-char.rules");
    assert!(
        rule.contains("RUN+=\"/usr/bin/nvhook dev-char-links\""),
        "{rule}"
    );
    // The commands exist in the nvhook the package installed.
    for args in [
        &["cdi", "refresh", "--help"][..],
        &["dev-char-links", "--help"],
    ] {
        let out = Command::new(root.path("/usr/bin/nvhook"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "nvhook {args:?}: {out:?}");
    }
}

// ---- the .rpm (read with Debian's rpm; its scripts are the .deb's) ----

fn rpm_query(args: &[&str]) -> String {
    rpm_query_of(&rpm(), args)
}

fn rpm_query_of(rpm: &Path, args: &[&str]) -> String {
    stdout_of(
        Command::new(require_program("rpm"))
            .arg("--query")
            .arg("--package")
            .args(args)
            .arg(rpm),
    )
}

#[test]
fn rpm_holds_the_same_files_with_a_noreplace_config_and_license() {
    let docs = [
        "/usr/share/doc/nvhook/README.md",
        "/usr/share/doc/nvhook/usage.txt",
        "/usr/share/licenses/nvhook/LICENSE",
    ];
    assert_eq!(lines(&rpm_query(&["--list"])), with_docs(&docs));
    assert_eq!(
        lines(&rpm_query(&["--configfiles"])),
        BTreeSet::from([CONFIG])
    );
    let flags = rpm_query(&["--queryformat", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]"]);
    assert!(
        flags.lines().any(|line| line == format!("{CONFIG} cn")),
        "{CONFIG} is not %config(noreplace)\n{flags}"
    );
    assert_eq!(
        rpm_query(&["--queryformat", "%{VERSION}-%{RELEASE}"]),
        format!("{VERSION}-1")
    );
    let requires = rpm_query(&["--requires"]);
    assert!(
        requires.lines().any(|line| line.starts_with("libc.so.6")),
        "no libc requirement\n{requires}"
    );
    assert_eq!(
        lines(&rpm_query(&["--recommends"])),
        BTreeSet::from(["(runc or crun)"])
    );
    assert_eq!(
        lines(&rpm_query(&["--conflicts"])),
        BTreeSet::from([
            "libnvidia-container-tools",
            "nvidia-container-toolkit",
            "nvidia-container-toolkit-base"
        ])
    );
}

// ---- arm64 (issue 29): packed from scripts/build-arm64.sh's aarch64 binaries ----

const PROGRAMS: [&str; 3] = [
    "/usr/bin/nvhook",
    "/usr/bin/nvhook-runtime",
    "/usr/bin/nvhook-nvml",
];

/// `readelf -h`'s class and machine of `path`: the ELF header's EI_CLASS and e_machine.
fn elf_class_and_machine(path: &Path) -> (String, String) {
    let header = support::readelf("-h", path);
    let field = |name: &str| {
        header
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in readelf -h {}:\n{header}", path.display()))
            .trim()
            .to_owned()
    };
    (field("Class:"), field("Machine:"))
}

/// The files of `deb`, unpacked into a directory of their own.
fn unpack(deb: &Path) -> TempDir {
    let unpacked = TempDir::new().expect("create a directory");
    stdout_of(
        Command::new(require_program("dpkg-deb"))
            .arg("--extract")
            .arg(deb)
            .arg(unpacked.path()),
    );
    unpacked
}

#[test]
fn arm64_deb_is_the_amd64_one_with_aarch64_programs() {
    let arm64 = deb_arm64();
    assert_eq!(deb_field(&arm64, "Architecture"), "arm64");
    assert_eq!(deb_field(&arm64, "Version"), VERSION);
    for same in ["Package", "Recommends", "Conflicts"] {
        assert_eq!(deb_field(&arm64, same), deb_field(&deb(), same), "{same}");
    }
    let (listing, files) = deb_contents(&arm64);
    assert_eq!(files, deb_files(), "{listing}");

    let unpacked = unpack(&arm64);
    for program in PROGRAMS {
        let path = unpacked.path().join(program.trim_start_matches('/'));
        assert_eq!(
            elf_class_and_machine(&path),
            ("ELF64".to_owned(), "AArch64".to_owned()),
            "{program} in the arm64 .deb"
        );
    }

    // Depends is named in Cargo.toml (dpkg-shlibdeps cannot read aarch64 programs here): it
    // must ask for at least the newest glibc symbol version nvhook-nvml uses.
    let depends = deb_field(&arm64, "Depends");
    let named = depends
        .strip_prefix("libc6 (>= ")
        .and_then(|v| v.strip_suffix(')'))
        .unwrap_or_else(|| panic!("Depends: {depends}"));
    let helper = unpacked.path().join("usr/bin/nvhook-nvml");
    let needs = support::readelf("-V", &helper);
    let version = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap()).collect() };
    let newest = needs
        .split(|c: char| c.is_whitespace())
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(version)
        .max()
        .expect("nvhook-nvml needs glibc symbols");
    assert!(
        version(named) >= newest,
        "Depends: {depends}, but nvhook-nvml needs GLIBC_{newest:?}"
    );
}

#[test]
fn aarch64_rpm_holds_the_arm64_debs_programs() {
    let rpm = rpm_aarch64();
    assert_eq!(rpm_query_of(&rpm, &["--queryformat", "%{ARCH}"]), "aarch64");
    // Read from the aarch64 nvhook-nvml itself: its loader and libc.
    let requires = rpm_query_of(&rpm, &["--requires"]);
    for needed in ["libc.so.6()(64bit)", "ld-linux-aarch64.so.1()(64bit)"] {
        assert!(
            requires.lines().any(|l| l == needed),
            "{needed}\n{requires}"
        );
    }
    assert_eq!(
        lines(&rpm_query_of(&rpm, &["--list"])),
        lines(&rpm_query(&["--list"]))
    );
    // The .rpm's file digests (SHA-256) are those of the arm64 .deb's programs, which the test
    // above reads as aarch64 ELF files: the same cross-built binaries.
    let digests = rpm_query_of(&rpm, &["--queryformat", "[%{FILENAMES} %{FILEDIGESTS}\n]"]);
    let unpacked = unpack(&deb_arm64());
    for program in PROGRAMS {
        let path = unpacked.path().join(program.trim_start_matches('/'));
        let sum = stdout_of(Command::new(require_program("sha256sum")).arg(&path));
        let sum = sum
            .split_whitespace()
            .next()
            .expect("sha256sum prints a sum");
        assert!(
            digests.lines().any(|l| l == format!("{program} {sum}")),
            "{program} (sha256 {sum}) is not the arm64 .deb's\n{digests}"
        );
    }
}

#[test]
fn rpm_carries_the_shared_postinst_and_prerm_as_scriptlets() {
    let scriptlet = |tag: &str| rpm_query(&["--queryformat", &format!("%{{{tag}}}")]);
    assert_eq!(scriptlet("POSTIN"), maintainer_script("postinst"));
    assert_eq!(scriptlet("PREUN"), maintainer_script("prerm"));
    let scripts = rpm_query(&["--scripts"]);
    for kind in ["postinstall", "preuninstall"] {
        assert!(
            scripts.contains(&format!("{kind} scriptlet (using /bin/sh)")),
            "no {kind} scriptlet\n{scripts}"
        );
    }
    assert!(!scripts.contains("postuninstall"), "{scripts}");

    // rpm's %post argument: 1 on a first install (the hint), 2 on an upgrade.
    let postin = scriptlet("POSTIN");
    // In a scratch root, as rpm --root runs it: a first install enables the units there.
    let scratch = tempfile::tempdir().expect("scratch root");
    let run_postin = |arg: &str| {
        stdout_of(
            Command::new(require_program("sh"))
                .args(["-c", &postin, "postinst", arg])
                .env("DPKG_ROOT", scratch.path()),
        )
    };
    assert!(run_postin("1").contains("nvhook configure docker"));
    assert_eq!(run_postin("2"), "");
    // NVIDIA's names are made only beside an installed nvhook, and only where missing.
    for link in NVIDIA_NAME_LINKS {
        assert!(fs::symlink_metadata(scratch.path().join(&link[1..])).is_err());
    }
    let bin = scratch.path().join("usr/bin");
    fs::create_dir_all(&bin).expect("scratch /usr/bin");
    fs::write(bin.join("nvhook"), "").expect("scratch nvhook");
    fs::set_permissions(
        bin.join("nvhook"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod scratch nvhook");
    fs::write(bin.join("nvidia-container-cli"), "NVIDIA's").expect("an NVIDIA program");
    run_postin("2");
    assert_eq!(
        fs::read_link(bin.join("nvidia-container-runtime-hook")).expect("link made"),
        Path::new("nvhook")
    );
    assert_eq!(
        fs::read_to_string(bin.join("nvidia-container-cli")).expect("left as it was"),
        "NVIDIA's"
    );
    // An erase takes out the links to nvhook and nothing else.
    let preun = scriptlet("PREUN");
    Command::new(require_program("sh"))
        .args(["-c", &preun, "prerm", "0"])
        .env("DPKG_ROOT", scratch.path())
        .output()
        .expect("run %preun");
    assert!(fs::symlink_metadata(bin.join("nvidia-container-runtime-hook")).is_err());
    assert!(bin.join("nvidia-container-cli").exists());
}

// ---- the installed binaries at work ----

#[test]
fn installed_nvhook_hook_gives_a_runc_container_its_gpu_and_libcuda() {
    let root = ScratchRoot::new();
    root.install_deb();
    let node = SimNode::create_for(4, &root.path("/usr/bin/nvhook"));
    let checks = gpucheck_args(4, &[]);
    let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &checks);
    bundle.env("NVIDIA_VISIBLE_DEVICES=1").prestart_hook(&node);
    let mut output = run_container(&bundle, RuntimeEnv::CgroupV1);
    output.hook_log = Some(node.log());
    output.assert_success();
    output.assert_gpus(4, &[1]);
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);
}
