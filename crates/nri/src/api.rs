//! The NRI API, generated from containerd/nri v0.12.2's `pkg/api/api.proto` (in `proto/`),
//! with the event mask the protocol carries as a plain integer.

include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));

/// The containerd/nri release whose protocol this crate speaks, as a plugin tells the engine
/// when it registers.
pub const NRI_VERSION: &str = "v0.12.2";

/// The protobuf package of both services.
pub const PACKAGE: &str = "nri.pkg.api.v1alpha1";
/// The service plugins serve and the engine calls.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The service the engine serves and plugins call.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// A set of [`Event`]s, as `ConfigureResponse.events` carries it: event `e` is bit `e - 1`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventMask(pub i32);

impl EventMask {
    pub fn of(events: &[Event]) -> EventMask {
        EventMask(events.iter().fold(0, |mask, e| mask | bit(*e)))
    }

    pub fn contains(self, event: Event) -> bool {
        self.0 & bit(event) != 0
    }
}

fn bit(e: Event) -> i32 {
    match e as i32 {
        0 => 0,
        n => 1 << (n - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_the_bits_the_engine_reads() {
        // containerd/nri: EventMask.Set(e) sets 1 << (e - 1).
        let mask = EventMask::of(&[Event::CreateContainer, Event::RemoveContainer]);
        assert_eq!(mask.0, (1 << 3) | (1 << 10));
        assert!(mask.contains(Event::CreateContainer));
        assert!(!mask.contains(Event::StopContainer));
        assert_eq!(EventMask::of(&[Event::Unknown]).0, 0);
    }
}
