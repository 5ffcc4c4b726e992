package sqlkit

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/outboxgo/outbox/dialect"
)

// Distributed SQL servers that speak the PostgreSQL or MySQL protocol report themselves as
// one or the other, so the built-in dialects would take them for the real thing. Some of
// them accept the claim's statements and do something else with them. The engine's Store.Check
// recognises them by what they report (docs/scaling.md has the sources) and refuses those
// the claim is unsafe on, or where something the Store is set to use is known to fail.

// ServerInfo is what the built-in dialects read to recognise a distributed SQL server.
type ServerInfo struct {
	// Version is what SELECT version() answers.
	Version string
	// Citus is the installed version of the citus extension (PostgreSQL), "" without it.
	Citus string
	// CitusDistributed reports that the outbox table is a Citus distributed table.
	CitusDistributed bool
	// Notify reports that the Store sends wake-ups across processes (PostgreSQL
	// NOTIFY): Options.DisableNotify is not set.
	Notify bool
}

// Distributed SQL products, as DistributedProduct names them.
const (
	productCockroach = "CockroachDB"
	productYugabyte  = "YugabyteDB"
	productTiDB      = "TiDB"
	productVitess    = "Vitess"
)

var (
	// "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built ...)", or OSS.
	cockroachVersion = regexp.MustCompile(`^CockroachDB \w+ v(\d+(?:\.\d+)*)`)
	// "PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-...", "PostgreSQL 15.12-YB-2025.2.3.0-b1".
	yugabyteVersion = regexp.MustCompile(`-YB-(\d+(?:\.\d+)*)`)
	// "8.0.11-TiDB-v7.5.0", "5.7.25-TiDB-v6.5.0-serverless".
	tidbVersion = regexp.MustCompile(`(?i)-TiDB-v?(\d+(?:\.\d+)*)`)
	// "8.0.30-Vitess" (vtgate's default), "5.7.9-vitess-10.0.0-SNAPSHOT".
	vitessVersion = regexp.MustCompile(`(?i)-vitess(?:-v?(\d+(?:\.\d+)*))?`)
)

// DistributedProduct names the distributed SQL server whose SELECT version() answered v,
// and its own version ("" when it reports none); product is "" for any other server.
func DistributedProduct(v string) (product, version string) {
	for _, p := range []struct {
		name string
		re   *regexp.Regexp
	}{{productCockroach, cockroachVersion}, {productYugabyte, yugabyteVersion}, {productTiDB, tidbVersion}, {productVitess, vitessVersion}} {
		if m := p.re.FindStringSubmatch(v); m != nil {
			return p.name, m[1]
		}
	}
	return "", ""
}

// atLeast reports whether the dotted version v is min or later; a version that does not
// parse is not.
func atLeast(v string, min ...int) bool {
	parts := strings.Split(v, ".")
	for i, want := range min {
		if i >= len(parts) {
			return want == 0
		}
		n, err := strconv.Atoi(parts[i])
		if err != nil {
			return false
		}
		if n != want {
			return n > want
		}
	}
	return true
}

// scalingDoc is where the verdicts below are explained, with their sources.
const scalingDoc = "see docs/scaling.md in the outbox module"

// JudgeServer recognises a distributed SQL server from what it reports and returns the
// [*dialect.CheckError] that refuses it, or nil when the built-in dialect may go ahead: on plain
// PostgreSQL, MySQL and MariaDB, and on the servers it is compatible enough with.
func JudgeServer(s ServerInfo) *dialect.CheckError {
	product, version := DistributedProduct(s.Version)
	switch product {
	case productTiDB:
		return &dialect.CheckError{
			Problem: fmt.Sprintf("the server is TiDB %s, which accepts SELECT ... FOR UPDATE SKIP LOCKED but does not lock "+
				"the rows it returns (a plain non-locking read): publishers would claim the same rows and deliver them twice", version),
			Fix: "keep the outbox table in MySQL 8.0.1+ or MariaDB 10.6+ (" + scalingDoc + ")",
		}
	case productCockroach:
		why := []string{"it has no LISTEN/NOTIFY"}
		if !atLeast(version, 22, 2) {
			why = append(why, "it has no SELECT ... FOR UPDATE SKIP LOCKED before v22.2")
		}
		why = append(why, "the built-in postgres dialect and its migrations are not tested on it")
		return &dialect.CheckError{
			Problem: fmt.Sprintf("the server is CockroachDB v%s, which the built-in postgres dialect does not support: %s",
				version, strings.Join(why, "; ")),
			Fix: "keep the outbox table in PostgreSQL, or write a Dialect for CockroachDB (" + scalingDoc + ")",
		}
	case productYugabyte:
		if s.Notify && !atLeast(version, 2025, 2, 3) {
			return &dialect.CheckError{
				Problem: fmt.Sprintf("the server is YugabyteDB %s, which has no LISTEN/NOTIFY before 2025.2.3: "+
					"every enqueue's pg_notify would fail", version),
				Fix: "set outbox.Options{DisableNotify: true}, and publishers poll (" + scalingDoc + ")",
			}
		}
	}
	if s.CitusDistributed {
		return &dialect.CheckError{
			Problem: "the outbox table is a Citus distributed table, and Citus runs no multi-shard SELECT ... FOR UPDATE: " +
				"every claim would fail",
			Fix: "keep the outbox table a local table on the coordinator (undistribute_table), or put it in a " +
				"database of its own (" + scalingDoc + ")",
		}
	}
	return nil
}
