//! The proof behind `cdi-mounts = "hook"`: what a container sees of the driver's files through
//! a spec whose runtime makes the mounts, through one whose createRuntime hook makes them, and
//! through such a spec as nvhook wrote it before its hook's arguments named a directory's
//! files in one group, compared file by file on whatever engine runs the container.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::node::SimNode;
use super::runc::Output;

/// `node`'s spec with the mounts left to the hook (`hook`) or to the runtime (`runtime`),
/// written as JSON to `spec` and read back.
pub fn write_spec(node: &SimNode, mounts_by: &str, spec: &Path) -> Value {
    node.set("cdi-mounts", &format!("\"{mounts_by}\""));
    node.generate_cdi_spec(spec);
    let text = std::fs::read_to_string(spec).expect("read the spec");
    serde_json::from_str(&text).expect("the spec is JSON")
}

/// Every mount of the spec, its own and its devices'.
pub fn spec_mounts(spec: &Value) -> Vec<Value> {
    let devices = spec["devices"].as_array().expect("devices");
    std::iter::once(&spec["containerEdits"])
        .chain(devices.iter().map(|d| &d["containerEdits"]))
        .flat_map(|e| e["mounts"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Asserts that a container sees the same driver files through `node`'s spec written each way,
/// written to `spec` (a `.json` path where the engine reads specs): `run` starts a container
/// with the spec's GPU and a shell (an image with `sh`, `stat`, `ls` and `cat`) running the
/// arguments it is given. The hook's spec names a file for its arguments; the one-entry spec
/// holds them all. The node is left with `cdi-mounts = "hook"`, and `spec` with its hook's
/// arguments one entry per flag.
pub fn assert_same_view_both_ways(
    engine: &str,
    node: &SimNode,
    spec: &Path,
    run: impl Fn(&[&str]) -> Output,
) {
    let runtime_spec = write_spec(node, "runtime", spec);
    let paths: Vec<String> = spec_mounts(&runtime_spec)
        .iter()
        .map(|m| m["containerPath"].as_str().expect("a path").to_string())
        .collect();
    assert!(!paths.is_empty(), "{engine}: {runtime_spec:#}");
    let by_runtime = container_view(&paths, &run);
    let hook_spec = write_spec(node, "hook", spec);
    assert!(
        spec_mounts(&hook_spec).is_empty(),
        "{engine}: {hook_spec:#}"
    );
    let by_hook = container_view(&paths, &run);
    assert_eq!(
        by_runtime, by_hook,
        "{engine}: the runtime's mounts (left) and the hook's (right) show different files"
    );
    let mut earlier = hook_spec.clone();
    let args = &mut earlier["containerEdits"]["hooks"][0]["args"];
    assert!(
        args.as_array()
            .is_some_and(|a| a.contains(&"--args-file".into())),
        "{engine}: the spec names a file for its hook's arguments: {args}"
    );
    assert!(
        with_args_file_inlined(args).contains(&"--bind-files".into()),
        "{engine}: {args}"
    );
    *args = one_entry_each(args).into();
    std::fs::write(spec, earlier.to_string()).expect("write the spec");
    let by_earlier_hook = container_view(&paths, &run);
    assert_eq!(
        by_hook, by_earlier_hook,
        "{engine}: the hook's grouped arguments (left) and one entry each (right) show different files"
    );
}

/// nvhook's hook arguments (a spec's JSON array) with the file a spec written to a file keeps
/// them in (`--args-file PATH SUM`, one argument a line) read in their place: the test's own
/// reading, not nvhook's.
pub fn with_args_file_inlined(args: &Value) -> Vec<String> {
    let args: Vec<String> =
        serde_json::from_value(args.clone()).expect("the hook's arguments are strings");
    let Some(at) = args.iter().position(|a| a == "--args-file") else {
        return args;
    };
    let text = std::fs::read_to_string(&args[at + 1]).expect("read the hook's argument file");
    let mut out = args[..at].to_vec();
    out.extend(text.lines().map(String::from));
    out.extend_from_slice(&args[at + 3..]);
    out
}

/// nvhook's hook arguments (a spec's JSON array, its argument file read in) with each group
/// (`--bind-files DIR A,B`, `--links`, `--lib64s`, `--lib32s`, and the `--host-root` their
/// sources are under) written out one entry per flag.
pub fn one_entry_each(args: &Value) -> Vec<String> {
    let args = with_args_file_inlined(args);
    let root = args
        .iter()
        .position(|a| a == "--host-root")
        .map(|at| args[at + 1].clone())
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let one = match arg.as_str() {
            "--host-root" => {
                it.next();
                continue;
            }
            "--bind-files" | "--bind-dirs" | "--bind-sockets" | "--links" | "--lib64s"
            | "--lib32s" => &arg[..arg.len() - 1],
            _ => {
                out.push(arg.clone());
                continue;
            }
        };
        let dir = it.next().expect("a group's directory");
        let dir = dir.strip_suffix('/').unwrap_or(dir);
        for entry in it.next().expect("a group's entries").split(',') {
            out.push(one.to_string());
            if one.starts_with("--bind-") {
                out.push(format!("{root}{dir}/{entry}"));
            }
            out.push(format!("{dir}/{entry}"));
        }
    }
    out
}

/// What a container sees of the driver's files, by container path: the file's type, size, mode
/// and owner (`stat`) and its mount's root, options, propagation and filesystem type
/// (mountinfo); plus the listing of each directory that holds them (links included).
fn container_view(paths: &[String], run: &impl Fn(&[&str]) -> Output) -> String {
    let mut dirs: Vec<&str> = paths
        .iter()
        .filter_map(|p| p.rsplit_once('/').map(|(dir, _)| dir))
        .filter(|d| !d.is_empty())
        .collect();
    dirs.sort();
    dirs.dedup();
    let script = format!(
        "stat -c '%n %F %s %a %u %g' {paths}; ls -ln {dirs}; cat /proc/self/mountinfo",
        paths = paths.join(" "),
        dirs = dirs.join(" "),
    );
    let output = run(&["/bin/sh", "-c", &script]);
    output.assert_success();
    let mut view = Vec::new();
    let mut mounts = BTreeMap::new();
    for line in output.stdout.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        // mountinfo: ID PARENT DEV ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        match fields.iter().position(|f| *f == "-") {
            Some(dash) if fields.len() > 5 && paths.iter().any(|p| p == fields[4]) => {
                // Root, options, propagation tags, filesystem type.
                mounts.insert(
                    fields[4].to_string(),
                    format!(
                        "{} {} [{}] {}",
                        fields[3],
                        fields[5],
                        fields[6..dash].join(" "),
                        fields[dash + 1]
                    ),
                );
            }
            Some(_) => {}
            None => view.push(without_time(line)),
        }
    }
    assert_eq!(
        mounts.len(),
        paths.len(),
        "every file is a mount:\n{output}"
    );
    for (path, mount) in mounts {
        view.push(format!("mount {path} {mount}"));
    }
    view.join("\n")
}

/// `ls -l`'s line without its time (month, day, time): links the hook makes at each start
/// differ in it. Any other line as it is, but for what is the filesystem's own (below).
fn without_time(line: &str) -> String {
    let fields: Vec<&str> = line.split_whitespace().collect();
    match line.chars().next() {
        // A directory's size and a listing's block total are the filesystem's own: a
        // directory made in the container's layer and one in a tmpfs the hook made hold the
        // same entries.
        Some('d') if fields.len() > 8 => {
            let mut kept = fields[..4].to_vec();
            kept.extend(&fields[8..]);
            kept.join(" ")
        }
        Some('l' | '-' | 's') if fields.len() > 8 => {
            let mut kept = fields[..5].to_vec();
            kept.extend(&fields[8..]);
            kept.join(" ")
        }
        _ if line.starts_with("total ") => "total".to_string(),
        _ => line.to_string(),
    }
}
