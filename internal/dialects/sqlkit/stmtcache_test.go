package sqlkit

import (
	"context"
	"database/sql"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"
)

// TestStmtCacheClosesItsStatements: a Store's prepared statements are closed once its
// cache is unreachable; database/sql would otherwise keep them until the pool closes.
func TestStmtCacheClosesItsStatements(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "stmts.db"))
	require.NoError(t, err)
	defer db.Close()
	var st *sql.Stmt
	func() {
		c := NewStmtCache(db)
		st, err = c.prepare(context.Background(), `SELECT 1`)
		require.NoError(t, err)
		require.NotNil(t, st)
		var one int
		require.NoError(t, st.QueryRow().Scan(&one), "open while the cache is in use")
	}()
	require.Eventually(t, func() bool {
		runtime.GC()
		var one int
		err := st.QueryRow().Scan(&one)
		return err != nil && strings.Contains(err.Error(), "statement is closed")
	}, 10*time.Second, 10*time.Millisecond)
}
