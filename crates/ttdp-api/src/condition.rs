//! Setting `status.conditions` the Kubernetes way.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Sets the condition of `new.type_` in `conditions` (merged by type). `lastTransitionTime`
/// moves only when the status changes; reason, message and observedGeneration always follow
/// `new`. Returns whether anything changed.
pub fn set_condition(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            let transition = if old.status == new.status {
                old.last_transition_time.clone()
            } else {
                new.last_transition_time.clone()
            };
            let merged = Condition {
                last_transition_time: transition,
                ..new
            };
            let changed = *old != merged;
            *old = merged;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// A condition with `status` `"True"` or `"False"`, stamped `now`.
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut cs = vec![];
        assert!(set_condition(
            &mut cs,
            condition("Ready", false, "Rolling", "1/3", Some(1), at(10))
        ));
        assert!(set_condition(
            &mut cs,
            condition("Ready", false, "Rolling", "2/3", Some(1), at(20))
        ));
        assert_eq!(cs[0].last_transition_time, at(10));
        assert_eq!(cs[0].message, "2/3");
        assert!(!set_condition(
            &mut cs,
            condition("Ready", false, "Rolling", "2/3", Some(1), at(25))
        ));
        assert!(set_condition(
            &mut cs,
            condition("Ready", true, "AllDone", "3/3", Some(1), at(30))
        ));
        assert_eq!(cs[0].last_transition_time, at(30));
        assert!(set_condition(
            &mut cs,
            condition("Paused", false, "NotPaused", "", Some(1), at(30))
        ));
        assert_eq!(cs.len(), 2);
    }
}
