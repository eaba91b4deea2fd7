//! ANSI colours by node state, and when to use them.

use std::io::IsTerminal;

use ttdp_api::NodeState;

/// A colour a cell can be printed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colour {
    /// Done.
    Green,
    /// Cordoning, Draining, Upgrading, Uncordoning.
    Cyan,
    /// Pending, and a paused policy.
    Yellow,
    /// Failed, Conflict, and conditions that are not OK.
    Red,
    /// HostManaged: the operator only observes.
    Grey,
}

impl Colour {
    /// The colour of a node state: green Done, cyan in flight, yellow Pending, red Failed and
    /// Conflict, grey HostManaged.
    pub fn of_state(state: NodeState) -> Colour {
        match state {
            NodeState::Done => Colour::Green,
            NodeState::Cordoning
            | NodeState::Draining
            | NodeState::Upgrading
            | NodeState::Uncordoning => Colour::Cyan,
            NodeState::Pending => Colour::Yellow,
            NodeState::Failed | NodeState::Conflict => Colour::Red,
            NodeState::HostManaged => Colour::Grey,
        }
    }

    fn sgr(self) -> &'static str {
        match self {
            Colour::Green => "32",
            Colour::Cyan => "36",
            Colour::Yellow => "33",
            Colour::Red => "31",
            Colour::Grey => "90",
        }
    }
}

/// Whether output is coloured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Palette {
    enabled: bool,
}

impl Palette {
    /// Colours on.
    pub const COLOUR: Palette = Palette { enabled: true };
    /// Colours off.
    pub const PLAIN: Palette = Palette { enabled: false };

    /// Colour only when stdout is a terminal, `--no-color` was not given and `NO_COLOR` is unset
    /// or empty (<https://no-color.org>).
    pub fn detect(no_color_flag: bool) -> Palette {
        let no_color_env = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Palette {
            enabled: !no_color_flag && !no_color_env && std::io::stdout().is_terminal(),
        }
    }

    /// Whether colours are on.
    pub fn enabled(self) -> bool {
        self.enabled
    }

    /// `text` wrapped in the colour's escape codes, or unchanged when colours are off.
    pub fn paint(self, text: &str, colour: Option<Colour>) -> String {
        match colour {
            Some(c) if self.enabled => format!("\x1b[{}m{text}\x1b[0m", c.sgr()),
            _ => text.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_has_the_documented_colour() {
        let expected = [
            (NodeState::Pending, Colour::Yellow),
            (NodeState::Cordoning, Colour::Cyan),
            (NodeState::Draining, Colour::Cyan),
            (NodeState::Upgrading, Colour::Cyan),
            (NodeState::Uncordoning, Colour::Cyan),
            (NodeState::Done, Colour::Green),
            (NodeState::Failed, Colour::Red),
            (NodeState::HostManaged, Colour::Grey),
            (NodeState::Conflict, Colour::Red),
        ];
        assert_eq!(expected.len(), NodeState::ALL.len());
        for (state, colour) in expected {
            assert_eq!(Colour::of_state(state), colour, "{state}");
        }
    }

    #[test]
    fn plain_palette_leaves_text_alone() {
        assert_eq!(Palette::PLAIN.paint("Done", Some(Colour::Green)), "Done");
        assert_eq!(
            Palette::COLOUR.paint("Done", Some(Colour::Green)),
            "\x1b[32mDone\x1b[0m"
        );
        assert_eq!(Palette::COLOUR.paint("x", None), "x");
    }
}
