package outbox

import (
	"database/sql"
	"errors"
	"fmt"
	"reflect"
)

// This file catches the transaction wrappers that satisfy [Tx] but cannot run a dialect's
// statements. A dialect writes SQL in its database's own placeholders ($1 on PostgreSQL, ?
// on MySQL and SQLite) and hands it to tx.ExecContext with its arguments. A wrapper that
// embeds a *sql.Tx and keeps its methods (sqlx.Tx) passes them on unchanged and works. A
// wrapper whose ExecContext formats the query itself does not: bun.Tx replaces bun's own
// "?" placeholders with the arguments as literals and sends the query without them, so a
// PostgreSQL statement arrives with $1 and nothing bound ("there is no parameter $1", which
// aborts the transaction), and a MySQL or SQLite one arrives with its values rewritten
// by bun's formatter. The fix is to pass the *sql.Tx such a wrapper embeds (tx.Tx for
// bun.Tx), which is the same transaction.
//
// Enqueue does not look through the wrapper by itself: a wrapper may exist to watch its
// queries (tracing, logging), and running past it unasked would hide the insert from it.

// formattingTx returns, for a transaction type known to format queries itself, the
// expression of the *sql.Tx it embeds; "" for any other type.
func formattingTx(tx Tx) string {
	if _, ok := tx.(*sql.Tx); ok {
		return "" // the common case, without reflection
	}
	t := reflect.TypeOf(tx)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() == "github.com/uptrace/bun" && t.Name() == "Tx" {
		return "tx.Tx"
	}
	return ""
}

// checkTx refuses, before any SQL runs, a transaction type known to rewrite the dialect's
// placeholders; the caller's transaction stays usable.
func checkTx(tx Tx) error {
	if fix := formattingTx(tx); fix != "" {
		return &CheckError{
			Problem: fmt.Sprintf("%T formats each query itself and rewrites the dialect's placeholders, so the outbox cannot write on it", tx),
			Fix:     fmt.Sprintf("pass %s, the *sql.Tx it embeds: the same transaction", fix),
		}
	}
	return nil
}

// placeholderError explains a PostgreSQL "there is no parameter $n" (SQLSTATE 42P02) met
// by an enqueue on q when q is not a *sql.Tx: a wrapper sent the statement without its
// arguments. It returns nil for any other error.
func placeholderError(q any, err error) error {
	if _, ok := q.(*sql.Tx); ok {
		return nil
	}
	var state interface{ SQLState() string }
	if !errors.As(err, &state) || state.SQLState() != "42P02" {
		return nil
	}
	return &CheckError{
		Problem: fmt.Sprintf("%T sent the statement without its arguments: it rewrites queries or their placeholders", q),
		Fix:     "pass the *sql.Tx it wraps (for a wrapper that embeds one, the embedded field), or a Tx that passes queries and arguments on unchanged",
		Err:     err,
	}
}
