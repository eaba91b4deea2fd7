//! Column-aligned text tables in kubectl's layout: upper-case headers, columns separated by
//! three spaces, no trailing whitespace, colour that does not disturb alignment.

use crate::palette::{Colour, Palette};

/// Spaces between columns, as kubectl's printer uses.
pub const COLUMN_GAP: usize = 3;

/// One table cell: its text and optional colour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    /// What is printed.
    pub text: String,
    /// How it is coloured (when the palette allows).
    pub colour: Option<Colour>,
}

impl Cell {
    /// An uncoloured cell.
    pub fn plain(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            colour: None,
        }
    }

    /// A coloured cell.
    pub fn coloured(text: impl Into<String>, colour: Colour) -> Cell {
        Cell {
            text: text.into(),
            colour: Some(colour),
        }
    }

    /// Printed width in terminal columns (characters; the table has no wide glyphs).
    pub fn width(&self) -> usize {
        self.text.chars().count()
    }
}

/// A table: a header row and data rows of cells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Column headings, printed as given.
    pub header: Vec<String>,
    /// Data rows; a short row leaves its last columns empty.
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// A table with these headings and no rows.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Table {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn push(&mut self, row: Vec<Cell>) {
        self.rows.push(row);
    }

    /// Width of each column: the widest of its heading and cells.
    pub fn column_widths(&self) -> Vec<usize> {
        let columns = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        (0..columns)
            .map(|i| {
                let head = self.header.get(i).map_or(0, |h| h.chars().count());
                self.rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(Cell::width)
                    .chain([head])
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// The table as text, one line per row, each ending in `\n`.
    pub fn render(&self, palette: Palette) -> String {
        let widths = self.column_widths();
        let mut out = String::new();
        let header: Vec<Cell> = self.header.iter().map(Cell::plain).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            render_row(&mut out, row, &widths, palette);
        }
        out
    }
}

fn render_row(out: &mut String, row: &[Cell], widths: &[usize], palette: Palette) {
    let last = row.iter().rposition(|c| !c.text.is_empty());
    let mut line = String::new();
    for (i, cell) in row.iter().enumerate() {
        if Some(i) > last || last.is_none() {
            break;
        }
        line.push_str(&palette.paint(&cell.text, cell.colour));
        if Some(i) != last {
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(cell.width())
                + COLUMN_GAP;
            line.push_str(&" ".repeat(pad));
        }
    }
    out.push_str(&line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns_without_trailing_spaces() {
        let mut t = Table::new(["NAME", "STATE"]);
        t.push(vec![Cell::plain("node-10"), Cell::plain("Done")]);
        t.push(vec![Cell::plain("n1"), Cell::plain("")]);
        assert_eq!(
            t.render(Palette::PLAIN),
            "NAME      STATE\nnode-10   Done\nn1\n"
        );
    }

    #[test]
    fn colour_does_not_change_alignment() {
        let mut t = Table::new(["A", "B"]);
        t.push(vec![
            Cell::coloured("Done", Colour::Green),
            Cell::plain("x"),
        ]);
        assert_eq!(
            t.render(Palette::COLOUR),
            "A      B\n\x1b[32mDone\x1b[0m   x\n"
        );
    }
}
