//! `status` as text: aligned columns, one table per part.

use std::fmt::Write;

use crate::snapshot::Status;

/// Renders `status` as text tables.
pub(crate) fn render(status: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "view epoch {}, {} member(s), coordinator {}",
        status.epoch,
        status.members.len(),
        status.coordinator
    );
    let rows: Vec<Vec<String>> = status
        .members
        .iter()
        .map(|m| {
            let mut role = Vec::new();
            if m.coordinator {
                role.push("coordinator");
            }
            if m.this {
                role.push("this member");
            }
            vec![m.id.clone(), m.address.clone(), role.join(", ")]
        })
        .collect();
    columns(&mut out, &["MEMBER", "ADDRESS", "ROLE"], &rows);
    out.push('\n');
    let rows: Vec<Vec<String>> = status
        .services
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.grantor
                    .clone()
                    .unwrap_or_else(|| "- (none serving)".into()),
                s.table.as_ref().map_or(0, |t| t.locks.len()).to_string(),
            ]
        })
        .collect();
    columns(&mut out, &["SERVICE", "GRANTOR", "LOCKS"], &rows);
    for service in &status.services {
        out.push('\n');
        let Some(table) = &service.table else {
            let _ = writeln!(
                out,
                "service {}: no lock table: {}",
                service.name,
                service.table_error.as_deref().unwrap_or("unknown")
            );
            continue;
        };
        let _ = writeln!(
            out,
            "service {}: lock table of grantor {} (view epoch {}){}",
            service.name,
            table.grantor,
            table.epoch,
            if table.truncated { ", truncated" } else { "" }
        );
        let mut rows = Vec::new();
        for lock in &table.locks {
            let waiters = lock
                .waiters
                .iter()
                .map(|w| format!("{} ({})", w.owner, w.mode))
                .collect::<Vec<_>>()
                .join(", ");
            if lock.holders.is_empty() {
                rows.push(vec![
                    lock.name.clone(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    waiters.clone(),
                ]);
            }
            for holder in &lock.holders {
                rows.push(vec![
                    lock.name.clone(),
                    holder.owner.clone(),
                    holder.mode.into(),
                    holder.token.to_string(),
                    holder
                        .lease_ms
                        .map_or_else(|| "-".into(), |ms| format!("{ms}ms")),
                    waiters.clone(),
                ]);
            }
        }
        columns(
            &mut out,
            &["LOCK", "HOLDER", "MODE", "TOKEN", "LEASE", "WAITING"],
            &rows,
        );
    }
    out
}

/// Writes `rows` under `header`, each column as wide as its widest cell.
fn columns(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
