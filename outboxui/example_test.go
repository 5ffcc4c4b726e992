package outboxui_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
	"github.com/outboxgo/outbox/outboxui"
)

// requireOperator stands for the service's own authentication middleware.
func requireOperator(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Operator") == "" {
			http.Error(w, "operators only", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// The view mounted under /ops/outbox of a service's mux, behind the service's own
// authentication.
func ExampleHandler() {
	dir, err := os.MkdirTemp("", "outboxui")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		log.Fatal(err)
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	ui := outboxui.Handler(store, outboxui.Options{Prefix: "/ops/outbox", ReadOnly: true})
	mux.Handle("/ops/outbox/", requireOperator(ui))

	for _, operator := range []string{"", "ada"} {
		req := httptest.NewRequest(http.MethodGet, "/ops/outbox/", nil)
		if operator != "" {
			req.Header.Set("X-Operator", operator)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(rec.Code, strings.Contains(rec.Body.String(), "<h1>Overview</h1>"))
	}
	// Output:
	// 401 false
	// 200 true
}
