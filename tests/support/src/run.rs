//! Running a bundle and checking that the run left nothing mounted on the host.

use super::bundle::Bundle;
use super::cmd::require_root;
use super::mounts::host_mounts_referencing;
use super::node::SimNode;
use super::runc::{Output, RuntimeEnv, run_container};

/// Runs `bundle` with runc, attaches `node`'s hook log to the output, and asserts that
/// nothing mounted during the run stays in the host's mount table.
#[track_caller]
pub fn run_clean(bundle: &Bundle, node: Option<&SimNode>, env: RuntimeEnv) -> Output {
    require_root();
    let mut output = run_container(bundle, env);
    output.hook_log = node.map(SimNode::log);
    let mut watched = vec![bundle.dir()];
    watched.extend(node.map(SimNode::root));
    let leaked = host_mounts_referencing(&watched);
    assert!(
        leaked.is_empty(),
        "mounts left on the host: {leaked:#?}\n{output}"
    );
    output
}
