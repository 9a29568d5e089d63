//! nvhook under NVIDIA's program names, held to what NVIDIA's own v1.20.0 `nvidia-cdi-hook` and
//! `nvidia-container-runtime-hook` answered to the same command lines (issue 35).
//! `tests/fixtures/nvidia-programs/transcripts.json` holds NVIDIA's answers, recorded from its
//! binaries by `scripts/nvidia-transcripts.sh` (CI cannot build them). For every row, nvhook,
//! linked under the row's program name and given the row's stdin (and bundle), must exit with
//! the same status, print on stdout iff NVIDIA's did, print NVIDIA's version line, name every
//! warning and error NVIDIA's named, show the usage where NVIDIA's did, and leave the bundle's
//! rootfs as NVIDIA's left it. Where nvhook answers otherwise, [`KNOWN_DIFFERENCES`] lists the
//! difference and why: the test passes with exactly those differences, no other and no fewer.
//! Run as root (the simulated node makes device nodes).

use nvhook_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde::Deserialize;
use support::{SimNode, link_to_nvhook, require_root};

/// One command line and NVIDIA's answer (see the fixture's README).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    program: String,
    args: Vec<String>,
    /// The OCI state on stdin (the bundle's path as `@BUNDLE@`); none: stdin is /dev/null.
    stdin: Option<String>,
    /// The bundle's files (name to JSON content) beside an empty `rootfs/`.
    bundle: Option<BTreeMap<String, serde_json::Value>>,
    exit: i32,
    stdout_empty: bool,
    stdout_first_line: Option<String>,
    /// stderr's lines, logrus's wrapper reduced to `level: msg`, Go's flag usage left out.
    stderr: Vec<String>,
    /// The first line of the Go flag usage NVIDIA's printed on stderr.
    stderr_usage: Option<String>,
    /// What NVIDIA's left in the bundle's rootfs, one path each (rows with a bundle).
    rootfs_after: Option<Vec<String>>,
}

/// What is compared, for each row where it applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Check {
    /// The exit status.
    Exit,
    /// stdout empty iff NVIDIA's was.
    StdoutEmpty,
    /// The first line of `--version`'s output (the second line, the commit, differs on purpose:
    /// nvhook names its own version there).
    VersionLine,
    /// Every warning and error message NVIDIA's printed is in nvhook's stderr.
    Messages,
    /// Go's flag usage on stderr where NVIDIA's printed it.
    Usage,
    /// The bundle's rootfs holds what NVIDIA's left there.
    Rootfs,
}

/// Where nvhook answers otherwise than NVIDIA's v1.20.0 programs, as found when the fixture was
/// made: (program, args, check, why). Each is left as it is for a decision; the test fails on
/// any difference not listed here, and on a listed one that is gone (then remove it).
const KNOWN_DIFFERENCES: &[(&str, &[&str], Check, &str)] = &[
    (
        "nvidia-cdi-hook",
        LIMITS_HOOK,
        Check::Exit,
        "apply-cuda-memory-limits came after v1.20.0 (toolkit PR #2075): v1.20.0 warns of an unknown hook and succeeds; nvhook answers the newer hook, which reads the OCI state and fails without one",
    ),
    (
        "nvidia-cdi-hook",
        LIMITS_HOOK,
        Check::Messages,
        "the same: nvhook does not call the newer toolkit's hook unsupported",
    ),
];

/// NVIDIA's createRuntime hook for GPU memory limits, as the fixture asked v1.20.0 for it.
const LIMITS_HOOK: &[&str] = &[
    "apply-cuda-memory-limits",
    "--driver-root",
    "/",
    "--gpu-id",
    "GPU-x",
];

const FIXTURE: &str = include_str!("fixtures/nvidia-programs/transcripts.json");

/// The message a line of NVIDIA's stderr names, if it is a warning or an error: logrus's level
/// and urfave's `Incorrect Usage: ` go; info and debug lines name none.
fn message(line: &str) -> Option<&str> {
    if ["info: ", "debug: ", "trace: "]
        .iter()
        .any(|level| line.starts_with(level))
    {
        return None;
    }
    [
        "warning: ",
        "error: ",
        "fatal: ",
        "panic: ",
        "Incorrect Usage: ",
    ]
    .iter()
    .find_map(|prefix| line.strip_prefix(prefix))
    .or(Some(line))
}

/// The paths under `root`, relative to it, sorted bytewise (as `LC_ALL=C sort`).
fn listing(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            let relative = path.strip_prefix(root).expect("under root");
            out.push(relative.to_str().expect("utf-8 path").to_string());
            if path.is_dir() && !path.is_symlink() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Runs nvhook as `row.program` (a link in `bin`) in `scratch`, with the row's stdin and a
/// fresh bundle in `scratch/bundle`.
fn run_row(row: &Row, bin: &Path, node: &SimNode, scratch: &Path) -> Output {
    let bundle = scratch.join("bundle");
    let _ = fs::remove_dir_all(&bundle);
    fs::create_dir_all(bundle.join("rootfs")).expect("mkdir bundle/rootfs");
    for (name, content) in row.bundle.iter().flatten() {
        assert!(!name.contains('/'), "bundle file {name}: a plain name");
        fs::write(bundle.join(name), content.to_string()).expect("write a bundle file");
    }
    let stdin = row
        .stdin
        .as_ref()
        .map(|state| state.replace("@BUNDLE@", bundle.to_str().expect("utf-8 bundle path")));
    let mut child = Command::new(bin.join(&row.program))
        .args(&row.args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("NVHOOK_CONFIG", node.config())
        .current_dir(scratch)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {} {:?}: {e}", row.program, row.args));
    if let (Some(state), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A program that reads no stdin may be gone already: a broken pipe is its answer.
        let _ = pipe.write_all(state.as_bytes());
    }
    child.wait_with_output().expect("wait for nvhook")
}

/// The checks `nvhook` fails on `row`, each with what it saw.
fn differences(row: &Row, nvhook: &Output, rootfs: &Path) -> Vec<(Check, String)> {
    let stdout = String::from_utf8_lossy(&nvhook.stdout);
    let stderr = String::from_utf8_lossy(&nvhook.stderr);
    let mut found = Vec::new();
    let exit = nvhook.status.code().unwrap_or(-1);
    if exit != row.exit {
        found.push((
            Check::Exit,
            format!("NVIDIA's exit {}, nvhook's {exit}", row.exit),
        ));
    }
    if stdout.is_empty() != row.stdout_empty {
        found.push((
            Check::StdoutEmpty,
            format!(
                "NVIDIA's stdout empty: {}, nvhook's stdout: {stdout:?}",
                row.stdout_empty
            ),
        ));
    }
    if let Some(want) = row
        .stdout_first_line
        .as_deref()
        .filter(|l| l.starts_with("NVIDIA ") && l.contains(" version "))
    {
        let got = stdout.lines().next().unwrap_or("");
        if got != want {
            found.push((
                Check::VersionLine,
                format!("NVIDIA's {want:?}, nvhook's {got:?}"),
            ));
        }
    }
    let missing: BTreeSet<&str> = row
        .stderr
        .iter()
        .filter_map(|line| message(line))
        .filter(|m| !stderr.contains(m))
        .collect();
    if !missing.is_empty() {
        found.push((
            Check::Messages,
            format!("nvhook's stderr lacks {missing:?}: {stderr:?}"),
        ));
    }
    if let Some(usage) = &row.stderr_usage
        && !stderr.contains(usage.as_str())
    {
        found.push((
            Check::Usage,
            format!("nvhook's stderr lacks {usage:?}: {stderr:?}"),
        ));
    }
    if let Some(want) = &row.rootfs_after {
        let got = listing(rootfs);
        if &got != want {
            found.push((
                Check::Rootfs,
                format!("NVIDIA's left {want:?}, nvhook's {got:?}"),
            ));
        }
    }
    found
}

#[test]
fn nvhook_answers_as_nvidias_programs_did() {
    require_root();
    let rows: Vec<Row> = serde_json::from_str(FIXTURE).expect("transcripts.json");
    let programs: BTreeSet<&str> = rows.iter().map(|r| r.program.as_str()).collect();
    assert_eq!(
        programs,
        BTreeSet::from(["nvidia-cdi-hook", "nvidia-container-runtime-hook"]),
        "the fixture's programs"
    );
    let node = SimNode::create(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    let scratch = dir.path().join("scratch");
    fs::create_dir(&bin).expect("mkdir bin");
    fs::create_dir(&scratch).expect("mkdir scratch");
    link_to_nvhook(&bin, &programs.iter().copied().collect::<Vec<_>>());

    let mut found: BTreeMap<(String, Vec<String>, Check), String> = BTreeMap::new();
    let mut table = String::from("program | args | NVIDIA exit | nvhook exit | same\n");
    for row in &rows {
        let out = run_row(row, &bin, &node, &scratch);
        let differs = differences(row, &out, &scratch.join("bundle/rootfs"));
        table.push_str(&format!(
            "{} | {} | {} | {} | {}\n",
            row.program,
            row.args.join(" "),
            row.exit,
            out.status.code().unwrap_or(-1),
            if differs.is_empty() {
                "yes".to_string()
            } else {
                let checks: Vec<_> = differs.iter().map(|(c, _)| format!("{c:?}")).collect();
                format!("no: {}", checks.join(", "))
            }
        ));
        for (check, said) in differs {
            found.insert((row.program.clone(), row.args.clone(), check), said);
        }
    }
    println!("{table}");

    let known: BTreeMap<(String, Vec<String>, Check), &str> = KNOWN_DIFFERENCES
        .iter()
        .map(|(program, args, check, why)| {
            let args = args.iter().map(|a| a.to_string()).collect();
            ((program.to_string(), args, *check), *why)
        })
        .collect();
    for key in known.keys() {
        assert!(
            rows.iter().any(|r| r.program == key.0 && r.args == key.1),
            "KNOWN_DIFFERENCES names {} {:?}, which the fixture has no row for",
            key.0,
            key.1
        );
    }
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(key, _)| !known.contains_key(*key))
        .map(|((program, args, check), said)| format!("{program} {args:?} {check:?}: {said}"))
        .collect();
    let gone: Vec<String> = known
        .iter()
        .filter(|(key, _)| !found.contains_key(*key))
        .map(|((program, args, check), why)| format!("{program} {args:?} {check:?} ({why})"))
        .collect();
    assert!(
        unexpected.is_empty() && gone.is_empty(),
        "nvhook differs from NVIDIA's programs where KNOWN_DIFFERENCES does not say so:\n  {}\n\
         and no longer differs where it says so (remove those):\n  {}\n\n{table}",
        unexpected.join("\n  "),
        gone.join("\n  "),
    );
}
