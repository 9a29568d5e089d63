//! The hook's order and what a failure at each step leaves undone, on recorded effects: no
//! root, no runtime. The real effects are run by tests/hook_e2e.rs and its neighbours.

use super::effects::{ContainerEffects, HostEffects};
use super::*;
use crate::plan::{DeviceNode, Mount, MountKind, ProcOverlay};
use nvhook_cgroup::DeviceRule;
use nvhook_model::plan::fixtures::two_node_plan;
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

/// One effect, as the fake saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Allow(Vec<DeviceRule>),
    Open(String),
    PrepareProc,
    Enter,
    Node(String),
    Attach(String),
    Links,
    Proc,
}

/// Records each effect that succeeded; fails (and records nothing) at `fail`.
#[derive(Clone)]
struct Recorder {
    done: Rc<RefCell<Vec<Op>>>,
    fail: Option<Op>,
    proc_prepared: bool,
}

impl Recorder {
    fn new(fail: Option<Op>) -> Recorder {
        Recorder {
            done: Rc::default(),
            fail,
            proc_prepared: false,
        }
    }

    fn record(&self, op: Op) -> Result<(), HookError> {
        if self.fail.as_ref() == Some(&op) {
            return Err(PrepareError::NoRoot.into());
        }
        self.done.borrow_mut().push(op);
        Ok(())
    }

    fn done(&self) -> Vec<Op> {
        self.done.borrow().clone()
    }
}

impl HostEffects for Recorder {
    type Source = String;
    type Inside = Recorder;

    fn allow_devices(&mut self, rules: &[DeviceRule]) -> Result<(), HookError> {
        self.record(Op::Allow(rules.to_vec()))
    }

    fn open_source(&mut self, mount: &Mount) -> Result<String, HookError> {
        let source = mount.source.display().to_string();
        self.record(Op::Open(source.clone()))?;
        Ok(source)
    }

    fn open_node(&mut self, _: &DeviceNode) -> Result<Option<String>, HookError> {
        Ok(None)
    }

    fn prepare_proc(&mut self, _: &ProcOverlay) -> Result<(), HookError> {
        self.record(Op::PrepareProc)?;
        self.proc_prepared = true;
        Ok(())
    }

    fn enter_container(self) -> Result<Recorder, HookError> {
        self.record(Op::Enter)?;
        Ok(self)
    }
}

impl ContainerEffects for Recorder {
    type Source = String;

    fn make_node(&mut self, node: &DeviceNode, _: Option<&String>) -> Result<(), HookError> {
        self.record(Op::Node(node.path.clone()))
    }

    fn attach(&mut self, source: &String, mount: &Mount) -> Result<(), HookError> {
        assert_eq!(
            *source,
            mount.source.display().to_string(),
            "source of {mount:?}"
        );
        self.record(Op::Attach(mount.destination.clone()))
    }

    fn link_and_cache(&mut self, _: &Plan) -> Result<(), HookError> {
        self.record(Op::Links)
    }

    fn overlay_proc(&mut self) -> Result<bool, HookError> {
        if !self.proc_prepared {
            return Ok(false);
        }
        self.record(Op::Proc)?;
        Ok(true)
    }
}

/// Two GPU nodes (nvidia0 and nvidiactl) with their rules, two mounts and the /proc overlay.
fn plan() -> Plan {
    let mut plan = two_node_plan();
    for (source, destination) in [
        ("/drv/libcuda.so.550", "/usr/lib/libcuda.so.550"),
        ("/drv/nvidia-smi", "/usr/bin/nvidia-smi"),
    ] {
        plan.mounts.push(Mount {
            source: source.into(),
            destination: destination.into(),
            kind: MountKind::File,
        });
    }
    plan.proc_overlay = Some(ProcOverlay {
        host_dir: "/proc/driver/nvidia".into(),
        gpus: vec!["0000:18:00.0".into()],
    });
    plan
}

fn run(fail: Option<Op>, listed: &[ListedNode]) -> (Result<Outcome, HookError>, Vec<Op>) {
    let recorder = Recorder::new(fail);
    let result = apply(recorder.clone(), listed, true, &plan(), &mut Step::start());
    (result, recorder.done())
}

fn all_rules() -> Vec<DeviceRule> {
    plan().cgroup_rules
}

#[test]
fn host_side_first_then_nodes_mounts_links_and_proc_inside() {
    let (result, done) = run(None, &[]);
    assert_eq!(
        result.unwrap(),
        Outcome::Applied {
            devices: 2,
            mounts: 2
        }
    );
    assert_eq!(
        done,
        [
            Op::Allow(all_rules()),
            Op::Open("/drv/libcuda.so.550".into()),
            Op::Open("/drv/nvidia-smi".into()),
            Op::PrepareProc,
            Op::Enter,
            Op::Node("/dev/nvidia0".into()),
            Op::Node("/dev/nvidiactl".into()),
            Op::Attach("/usr/lib/libcuda.so.550".into()),
            Op::Attach("/usr/bin/nvidia-smi".into()),
            Op::Links,
            Op::Proc,
        ]
    );
}

#[test]
fn nodes_the_spec_lists_are_left_to_the_runtime_with_their_rules() {
    let listed = [
        (Path::new("/dev/nvidia0"), Some(195), Some(0)),
        (Path::new("/dev/nvidiactl"), Some(195), Some(255)),
    ];
    let (result, done) = run(None, &listed);
    assert_eq!(
        result.unwrap(),
        Outcome::Applied {
            devices: 0,
            mounts: 2
        }
    );
    assert!(
        done.iter()
            .all(|op| !matches!(op, Op::Allow(_) | Op::Node(_))),
        "{done:?}"
    );
}

/// A failure at `op` is reported, and nothing after it in the order happens.
fn stops_at(op: Op) {
    let full = run(None, &[]).1;
    let at = full.iter().position(|o| *o == op).expect("op in the order");
    let (result, done) = run(Some(op.clone()), &[]);
    assert!(result.is_err(), "failing {op:?} must fail the hook");
    assert_eq!(done, full[..at], "after failing {op:?}");
}

#[test]
fn a_cgroup_failure_opens_nothing_and_enters_nothing() {
    stops_at(Op::Allow(all_rules()));
}

#[test]
fn a_source_that_cannot_be_opened_stops_the_hook_before_the_container_is_touched() {
    stops_at(Op::Open("/drv/nvidia-smi".into()));
}

#[test]
fn a_namespace_that_cannot_be_entered_gets_no_node_and_no_mount() {
    stops_at(Op::Enter);
}

#[test]
fn a_node_that_cannot_be_made_stops_before_the_mounts() {
    stops_at(Op::Node("/dev/nvidiactl".into()));
}

#[test]
fn a_mount_that_fails_stops_before_the_links_and_the_cache() {
    stops_at(Op::Attach("/usr/lib/libcuda.so.550".into()));
}

#[test]
fn no_overlay_is_prepared_when_the_plan_has_none() {
    let mut plan = plan();
    plan.proc_overlay = None;
    let recorder = Recorder::new(None);
    apply(recorder.clone(), &[], true, &plan, &mut Step::start()).unwrap();
    let done = recorder.done();
    assert!(
        !done.contains(&Op::PrepareProc) && !done.contains(&Op::Proc),
        "{done:?}"
    );
}

#[test]
fn no_cgroups_leaves_the_rules_to_the_caller_and_makes_the_nodes() {
    let recorder = Recorder::new(None);
    apply(recorder.clone(), &[], false, &plan(), &mut Step::start()).unwrap();
    let done = recorder.done();
    assert!(
        !done.iter().any(|op| matches!(op, Op::Allow(_))),
        "{done:?}"
    );
    assert!(
        done.contains(&Op::Node("/dev/nvidiactl".into())),
        "{done:?}"
    );
}
