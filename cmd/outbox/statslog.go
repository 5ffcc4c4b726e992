package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outboxgo/outbox/logrepl/mysqlbinlog"
	"github.com/outboxgo/outbox/logrepl/pglog"
)

// logReaderJSON is one log reader's state in the stats document: a PostgreSQL slot
// (kind "slot") or a MySQL/MariaDB reader's stored position (kind "binlog"). Its keys are
// part of the command's interface; those of the other kind are absent.
type logReaderJSON struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Exists: the slot exists, or the reader's position is stored.
	Exists bool `json:"exists"`
	// Active: a reader streams the slot, or holds the reader's lock.
	Active   bool  `json:"active"`
	LagBytes int64 `json:"lag_bytes"`

	RetainedWALBytes *int64 `json:"retained_wal_bytes,omitempty"`
	WALStatus        string `json:"wal_status,omitempty"`
	Invalidated      string `json:"invalidated,omitempty"`

	GTID       string     `json:"gtid,omitempty"`
	File       string     `json:"file,omitempty"`
	Pos        *int64     `json:"pos,omitempty"`
	Purged     *bool      `json:"purged,omitempty"`
	ServerFile string     `json:"server_file,omitempty"`
	ServerPos  *int64     `json:"server_pos,omitempty"`
	UpdatedAt  *time.Time `json:"updated_at,omitempty"`
}

// readLogState reads the state of the table's log readers: PostgreSQL's slots of the
// table, MySQL's stored positions, or those named in slots; none on SQLite, and none
// where the table is not delivered from the log.
func readLogState(ctx context.Context, cn *conn, slots []string) ([]logReaderJSON, error) {
	var out []logReaderJSON
	switch cn.dialect {
	case "postgres":
		got, err := outboxpglog.Slots(ctx, cn.store, slots...)
		if err != nil {
			return nil, err
		}
		for _, s := range got {
			r := logReaderJSON{Name: s.Name, Kind: "slot", Exists: s.Exists, Active: s.Active, LagBytes: s.LagBytes,
				WALStatus: s.WALStatus, Invalidated: s.Invalidated}
			if s.Exists {
				r.RetainedWALBytes = &s.RetainedWALBytes
			}
			out = append(out, r)
		}
	case "mysql":
		got, err := outboxbinlog.Positions(ctx, cn.store, slots...)
		if err != nil {
			return nil, err
		}
		for _, p := range got {
			r := logReaderJSON{Name: p.Reader, Kind: "binlog", Exists: p.Stored, Active: p.Reading, LagBytes: p.LagBytes,
				ServerFile: p.ServerFile, ServerPos: &p.ServerPos}
			if p.Stored {
				r.GTID, r.File, r.Pos, r.Purged, r.UpdatedAt = p.GTID, p.File, &p.Pos, &p.Purged, &p.UpdatedAt
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// logRow is a log reader's state as the text output shows it, with its database when
// stats reads several.
type logRow struct {
	db string
	r  logReaderJSON
}

// printLog prints the log readers' table, when there are any, after the counts.
func printLog(c *cli, rows []logRow, withDB bool) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(c.stdout)
	tw := c.table()
	head := "LOG READER\tKIND\tACTIVE\tLAG\tRETAINED WAL\tSTATUS\tPOSITION"
	if withDB {
		head = "DATABASE\t" + head
	}
	fmt.Fprintln(tw, head)
	for _, row := range rows {
		r := row.r
		if withDB {
			fmt.Fprintf(tw, "%s\t", row.db)
		}
		active := map[bool]string{true: "yes", false: "no"}[r.Active]
		lag, retained, status, position := bytesCell(r.LagBytes), "-", "", "-"
		switch {
		case r.Kind == "slot" && !r.Exists:
			lag, status = "-", "no such slot"
		case r.Kind == "slot":
			retained, status = bytesCell(*r.RetainedWALBytes), r.WALStatus
			if r.Invalidated != "" {
				status = "invalidated (" + r.Invalidated + ")"
			}
		case !r.Exists:
			lag, status = "-", "no position"
		default:
			status, position = "available", fmt.Sprintf("%s:%d", r.File, *r.Pos)
			if *r.Purged {
				lag, status = "-", "purged"
			}
		}
		if r.Kind == "binlog" {
			position += fmt.Sprintf(" (server at %s:%d)", r.ServerFile, *r.ServerPos)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Kind, active, lag, retained, status, position)
	}
	_ = tw.Flush()
	logNotes(c.stdout, rows)
}

// logNotes says what an invalidated slot or a purged position means, once each.
func logNotes(w io.Writer, rows []logRow) {
	var lost, purged []string
	for _, row := range rows {
		switch {
		case row.r.Invalidated != "":
			lost = append(lost, row.r.Name)
		case row.r.Purged != nil && *row.r.Purged:
			purged = append(purged, row.r.Name)
		}
	}
	if len(lost) > 0 {
		fmt.Fprintf(w, "invalidated slots (%s) can never be read again: their reader creates them anew, and polling delivers the rows in between once their leases run out\n", strings.Join(lost, ", "))
	}
	if len(purged) > 0 {
		fmt.Fprintf(w, "purged positions (%s): the binlog there is gone; the reader starts again at the server's current position, and polling delivers the rows in between once their leases run out\n", strings.Join(purged, ", "))
	}
}

// bytesCell formats a byte count for a table, in binary units.
func bytesCell(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
