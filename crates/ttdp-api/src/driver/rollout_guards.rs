//! The optional guards of a rollout in `spec.upgradePolicy`: a canary that upgrades first and
//! soaks, a wait for jobs before a node is drained, and maintenance windows outside which no node
//! starts. Each is off when absent, so a policy without them rolls out as before.

use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, ToSpan, Zoned};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::duration::parse_duration;

/// Upgrade a few nodes first, then wait while they run, then the rest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanaryPolicy {
    /// How many nodes upgrade first: an integer >= 1 or a percentage of the matched nodes such
    /// as `"10%"` (rounded down, at least 1). They are the first nodes in name order.
    #[x_kube(validation = Rule::new("string(self).matches('^([1-9][0-9]*|([1-9][0-9]?|100)%)$')").message(
        "spec.upgradePolicy.canary.nodes must be an integer >= 1 or a percentage from 1% to 100% such as \"10%\""
    ))]
    pub nodes: IntOrString,

    /// Seconds the canary nodes run the new version, all Done and Ready, before any other node
    /// starts. A canary node that fails or goes unready meanwhile halts the rollout.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 604800").message(
        "spec.upgradePolicy.canary.soakSeconds must be from 0 to 604800 (7 days)"
    ))]
    pub soak_seconds: i64,

    /// When the canary halts the rollout, take the canary nodes back to the version they had,
    /// through the same cordon, drain, swap and uncordon.
    #[serde(default)]
    pub auto_rollback: bool,
}

/// Wait for matching pods on a cordoned node to finish before anything is evicted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WaitForCompletion {
    /// Label selector of the pods to wait for (`key=value`, `key in (a,b)`, ...), e.g.
    /// `job-name` for every Job's pods.
    #[schemars(length(min = 1, max = 1024))]
    pub pod_selector: String,

    /// Seconds to wait at most; 0 waits for as long as it takes.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 604800").message(
        "spec.upgradePolicy.waitForCompletion.timeoutSeconds must be from 0 (no limit) to 604800 (7 days)"
    ))]
    pub timeout_seconds: i64,

    /// What the timeout leads to: `Drain` (evict the pods still running, as without the wait)
    /// or `Fail` (fail the node, leaving its pods alone; the node stays cordoned until a retry).
    #[serde(default = "default_on_timeout")]
    #[x_kube(validation = Rule::new("self in ['Drain', 'Fail']").message(
        "spec.upgradePolicy.waitForCompletion.onTimeout must be Drain or Fail"
    ))]
    pub on_timeout: String,
}

fn default_on_timeout() -> String {
    "Drain".to_owned()
}

/// When nodes may start upgrading.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceSchedule {
    /// IANA time zone of the windows, such as `Europe/Berlin`; `UTC` when unset.
    #[serde(default = "default_time_zone")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,

    /// The windows. Outside all of them no node starts Cordoning; nodes in flight finish.
    #[schemars(length(min = 1, max = 32))]
    pub windows: Vec<MaintenanceWindow>,
}

fn default_time_zone() -> String {
    "UTC".to_owned()
}

/// A weekly window: on each of `days`, from `start` for `duration`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// The days it opens on: `Mon`, `Tue`, `Wed`, `Thu`, `Fri`, `Sat`, `Sun`.
    #[schemars(length(min = 1, max = 7), inner(length(max = 3)))]
    #[x_kube(validation = Rule::new("self.all(d, d in ['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'])").message(
        "spec.upgradePolicy.schedule.windows[].days must name days as Mon, Tue, Wed, Thu, Fri, Sat or Sun"
    ))]
    pub days: Vec<String>,

    /// Local time it opens, `HH:MM` (24-hour).
    #[schemars(length(max = 5))]
    #[x_kube(validation = Rule::new("self.matches('^([01][0-9]|2[0-3]):[0-5][0-9]$')").message(
        "spec.upgradePolicy.schedule.windows[].start must be a 24-hour time HH:MM such as 02:30"
    ))]
    pub start: String,

    /// How long it stays open, e.g. `4h`, `90m`, `1h30m` (at most 7 days).
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+h)?([0-9]+m)?$') && self != ''").message(
        "spec.upgradePolicy.schedule.windows[].duration must be hours and/or minutes such as 4h, 90m or 1h30m"
    ))]
    pub duration: String,
}

/// A schedule the schema accepts but that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The time zone is not in the IANA database.
    #[error(
        "spec.upgradePolicy.schedule.timeZone {0:?} is not an IANA time zone such as UTC or Europe/Berlin"
    )]
    TimeZone(String),
    /// A window's day, start or duration does not parse.
    #[error("spec.upgradePolicy.schedule.windows[{index}]: {reason}")]
    Window {
        /// Which window.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// Whether a schedule lets nodes start at some instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowState {
    /// Inside a window, which closes at this instant (the latest close of the open windows).
    Open {
        /// When the window closes.
        closes: Timestamp,
    },
    /// Outside every window; the next one opens at this instant.
    Closed {
        /// When the next window opens.
        opens: Timestamp,
    },
}

/// One window with its parts parsed.
struct Weekly {
    days: Vec<Weekday>,
    start: Time,
    length: Span,
}

impl MaintenanceSchedule {
    /// Whether nodes may start at `now`, and until or from when.
    pub fn state_at(&self, now: Timestamp) -> Result<WindowState, ScheduleError> {
        let zone = TimeZone::get(&self.time_zone)
            .map_err(|_| ScheduleError::TimeZone(self.time_zone.clone()))?;
        let windows = self.parsed()?;
        let here = now.to_zoned(zone);
        let mut closes: Option<Timestamp> = None;
        let mut opens: Option<Timestamp> = None;
        // A window opened up to 7 days ago may still be open; one opening within the next 7
        // days is the next. Each day of that fortnight is checked once per window.
        for offset in -7i64..=7 {
            let Ok(day) = here.date().checked_add(offset.days()) else {
                continue;
            };
            for w in windows.iter().filter(|w| w.days.contains(&day.weekday())) {
                let Some((start, end)) = w.instants(day, &here) else {
                    continue;
                };
                if start <= now && now < end {
                    closes = Some(closes.map_or(end, |c| c.max(end)));
                } else if start > now {
                    opens = Some(opens.map_or(start, |o| o.min(start)));
                }
            }
        }
        match (closes, opens) {
            (Some(closes), _) => Ok(WindowState::Open { closes }),
            (None, Some(opens)) => Ok(WindowState::Closed { opens }),
            // Every window has at least one day, so one opens within 7 days.
            (None, None) => Err(ScheduleError::Window {
                index: 0,
                reason: "no window opens within a week".to_owned(),
            }),
        }
    }

    /// Checks what the schema cannot: the time zone exists and every window parses.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        TimeZone::get(&self.time_zone)
            .map_err(|_| ScheduleError::TimeZone(self.time_zone.clone()))?;
        self.parsed().map(|_| ())
    }

    fn parsed(&self) -> Result<Vec<Weekly>, ScheduleError> {
        self.windows
            .iter()
            .enumerate()
            .map(|(index, w)| {
                w.parsed()
                    .map_err(|reason| ScheduleError::Window { index, reason })
            })
            .collect()
    }
}

impl MaintenanceWindow {
    fn parsed(&self) -> Result<Weekly, String> {
        let days = self
            .days
            .iter()
            .map(|d| weekday(d).ok_or_else(|| format!("unknown day {d:?}; use Mon to Sun")))
            .collect::<Result<Vec<_>, _>>()?;
        let start: Time = format!("{}:00", self.start)
            .parse()
            .map_err(|_| format!("start {:?} is not HH:MM", self.start))?;
        let length = parse_duration(&self.duration)?;
        let seconds = i64::try_from(length.as_secs()).unwrap_or(i64::MAX);
        if !(60..=7 * 24 * 3600).contains(&seconds) {
            return Err(format!(
                "duration {:?} must be from 1m to 168h",
                self.duration
            ));
        }
        Ok(Weekly {
            days,
            start,
            length: seconds.seconds(),
        })
    }
}

impl Weekly {
    /// The instants this window opens and closes when it opens on `day` (in `here`'s zone).
    fn instants(&self, day: jiff::civil::Date, here: &Zoned) -> Option<(Timestamp, Timestamp)> {
        let start = day
            .to_datetime(self.start)
            .to_zoned(here.time_zone().clone())
            .ok()?;
        let end = start.timestamp().checked_add(self.length).ok()?;
        Some((start.timestamp(), end))
    }
}

fn weekday(name: &str) -> Option<Weekday> {
    Some(match name {
        "Mon" => Weekday::Monday,
        "Tue" => Weekday::Tuesday,
        "Wed" => Weekday::Wednesday,
        "Thu" => Weekday::Thursday,
        "Fri" => Weekday::Friday,
        "Sat" => Weekday::Saturday,
        "Sun" => Weekday::Sunday,
        _ => return None,
    })
}

/// How many nodes are canaries when `matched` nodes are selected: an integer as given (at most
/// `matched`), a percentage of `matched` rounded down, never less than 1. None when `nodes` is
/// neither (the schema rejects that).
pub fn canary_count(nodes: &IntOrString, matched: usize) -> Option<usize> {
    let count = match nodes {
        IntOrString::Int(n) => usize::try_from(*n).ok().filter(|n| *n >= 1)?,
        IntOrString::String(s) => match s.strip_suffix('%') {
            Some(p) => {
                let pct = p.parse::<usize>().ok().filter(|p| (1..=100).contains(p))?;
                (matched * pct / 100).max(1)
            }
            None => s.parse::<usize>().ok().filter(|n| *n >= 1)?,
        },
    };
    Some(count.min(matched.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(zone: &str, days: &[&str], start: &str, duration: &str) -> MaintenanceSchedule {
        MaintenanceSchedule {
            time_zone: zone.to_owned(),
            windows: vec![MaintenanceWindow {
                days: days.iter().map(|d| (*d).to_owned()).collect(),
                start: start.to_owned(),
                duration: duration.to_owned(),
            }],
        }
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn inside_a_window_it_is_open_until_it_closes() {
        // 2026-12-05 is a Saturday.
        let s = schedule("UTC", &["Sat"], "02:00", "4h");
        assert_eq!(
            s.state_at(at("2026-12-05T03:00:00Z")),
            Ok(WindowState::Open {
                closes: at("2026-12-05T06:00:00Z")
            })
        );
    }

    #[test]
    fn outside_it_is_closed_until_the_next_opening() {
        let s = schedule("UTC", &["Sat", "Sun"], "02:00", "4h");
        // Saturday after the window: Sunday's opens next.
        assert_eq!(
            s.state_at(at("2026-12-05T06:00:00Z")),
            Ok(WindowState::Closed {
                opens: at("2026-12-06T02:00:00Z")
            })
        );
        // Tuesday: next Saturday.
        assert_eq!(
            s.state_at(at("2026-12-01T12:00:00Z")),
            Ok(WindowState::Closed {
                opens: at("2026-12-05T02:00:00Z")
            })
        );
    }

    #[test]
    fn a_window_spanning_midnight_stays_open_the_next_day() {
        let s = schedule("UTC", &["Fri"], "22:00", "6h");
        assert_eq!(
            s.state_at(at("2026-12-05T01:00:00Z")),
            Ok(WindowState::Open {
                closes: at("2026-12-05T04:00:00Z")
            })
        );
    }

    #[test]
    fn windows_are_in_the_schedules_time_zone() {
        // 02:00 in Berlin (UTC+1 in December) is 01:00 UTC.
        let s = schedule("Europe/Berlin", &["Sat"], "02:00", "1h");
        assert_eq!(
            s.state_at(at("2026-12-05T01:30:00Z")),
            Ok(WindowState::Open {
                closes: at("2026-12-05T02:00:00Z")
            })
        );
    }

    #[test]
    fn unusable_schedules_say_what_is_wrong() {
        let bad_zone = schedule("Mars/Olympus", &["Sat"], "02:00", "1h");
        assert_eq!(
            bad_zone.validate(),
            Err(ScheduleError::TimeZone("Mars/Olympus".into()))
        );
        let too_long = schedule("UTC", &["Sat"], "02:00", "200h");
        assert!(
            matches!(too_long.validate(), Err(ScheduleError::Window { index: 0, ref reason }) if reason.contains("168h")),
            "{:?}",
            too_long.validate()
        );
    }

    #[test]
    fn canary_counts_round_down_and_stay_within_the_fleet() {
        assert_eq!(canary_count(&IntOrString::Int(2), 10), Some(2));
        assert_eq!(canary_count(&IntOrString::Int(20), 10), Some(10));
        assert_eq!(
            canary_count(&IntOrString::String("25%".into()), 10),
            Some(2)
        );
        assert_eq!(canary_count(&IntOrString::String("1%".into()), 10), Some(1));
        assert_eq!(canary_count(&IntOrString::String("0%".into()), 10), None);
        assert_eq!(canary_count(&IntOrString::Int(0), 10), None);
    }
}
