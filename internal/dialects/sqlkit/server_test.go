package sqlkit

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox/dialect"
)

// The version strings below are what these servers answer to SELECT version(), as
// published by their projects and users:
//
//   - TiDB: "8.0.11-TiDB-v8.5.6" in https://github.com/pingcap/tidb/issues/69720 (the issue
//     that shows SKIP LOCKED reading without locking), "8.0.11-TiDB-v7.5.1" in TiDB's
//     documentation of VERSION(), "-serverless" on TiDB Cloud.
//   - CockroachDB: "CockroachDB CCL v23.1.11 (aarch64-apple-darwin21.2, built 2023/09/27
//     02:20:44, go1.19.10)", the form of its version() on every release; OSS builds say OSS.
//   - YugabyteDB: "PostgreSQL 11.2-YB-2.6.1.0-b0 on x86_64-pc-linux-gnu, ..." (YSQL on
//     PostgreSQL 11), "PostgreSQL 15.12-YB-2025.2.3.0-b1" (on PostgreSQL 15).
//   - Vitess: vtgate reports the MySQL version it imitates plus "-Vitess"
//     (https://github.com/vitessio/vitess/blob/v0.19.3/go/vt/servenv/mysql.go), and
//     "5.7.9-vitess-10.0.0-SNAPSHOT" in version 10 (https://github.com/vitessio/vitess/pull/7337);
//     PlanetScale answered "8.0.23-vitess" (https://github.com/laravel/framework/pull/44027).
func TestDistributedProduct(t *testing.T) {
	t.Parallel()
	for v, want := range map[string][2]string{
		"8.0.11-TiDB-v8.5.6":            {productTiDB, "8.5.6"},
		"8.0.11-TiDB-v7.5.0":            {productTiDB, "7.5.0"},
		"8.0.11-TiDB-v7.5.2-serverless": {productTiDB, "7.5.2"},
		"5.7.25-TiDB-v6.5.0":            {productTiDB, "6.5.0"},
		"CockroachDB CCL v23.1.11 (aarch64-apple-darwin21.2, built 2023/09/27 02:20:44, go1.19.10)":                  {productCockroach, "23.1.11"},
		"CockroachDB OSS v21.2.3 (x86_64-unknown-linux-gnu, built 2021/12/14 15:26:09, go1.16.6)":                    {productCockroach, "21.2.3"},
		"PostgreSQL 11.2-YB-2.6.1.0-b0 on x86_64-pc-linux-gnu, compiled by gcc (Homebrew gcc 5.5.0_4) 5.5.0, 64-bit": {productYugabyte, "2.6.1.0"},
		"PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-pc-linux-gnu":                                                      {productYugabyte, "2.18.0.0"},
		"PostgreSQL 15.12-YB-2025.2.3.0-b1":                                                                          {productYugabyte, "2025.2.3.0"},
		"8.0.30-Vitess":                                                                                              {productVitess, ""},
		"8.0.23-vitess":                                                                                              {productVitess, ""},
		"5.7.9-vitess-10.0.0-SNAPSHOT":                                                                               {productVitess, "10.0.0"},
		// Not distributed: the servers the built-in dialects are written for.
		"PostgreSQL 16.4 (Debian 16.4-1.pgdg120+1) on x86_64-pc-linux-gnu, compiled by gcc": {"", ""},
		"11.4.2-MariaDB-ubu2404":          {"", ""},
		"10.6.18-MariaDB-log":             {"", ""},
		"8.0.36":                          {"", ""},
		"8.0.46-0ubuntu0.22.04.4":         {"", ""},
		"5.5.5-10.11.6-MariaDB-0+deb12u1": {"", ""},
	} {
		product, version := DistributedProduct(v)
		require.Equal(t, want, [2]string{product, version}, v)
	}
}

// TestJudgeServer: TiDB is refused always, CockroachDB always (with why, by version),
// YugabyteDB before 2025.2.3 only while notifications are on, a Citus distributed table
// always; the rest pass.
func TestJudgeServer(t *testing.T) {
	t.Parallel()
	refused := func(s ServerInfo, want ...string) {
		t.Helper()
		ce := JudgeServer(s)
		require.NotNil(t, ce, "%+v", s)
		require.ErrorIs(t, ce, dialect.ErrMisconfigured)
		require.NotEmpty(t, ce.Fix)
		require.Contains(t, ce.Fix, "docs/scaling.md")
		for _, w := range want {
			require.ErrorContains(t, ce, w)
		}
	}
	for _, notify := range []bool{false, true} {
		refused(ServerInfo{Version: "8.0.11-TiDB-v8.5.6", Notify: notify}, "TiDB 8.5.6", "does not lock", "MySQL 8.0.1+ or MariaDB 10.6+")
		refused(ServerInfo{Version: "8.0.11-TiDB-v7.5.2-serverless", Notify: notify}, "TiDB 7.5.2")
		refused(ServerInfo{Version: "CockroachDB CCL v23.1.11 (aarch64-apple-darwin21.2, built 2023/09/27 02:20:44, go1.19.10)", Notify: notify},
			"CockroachDB v23.1.11", "no LISTEN/NOTIFY", "not tested")
		refused(ServerInfo{Version: "PostgreSQL 16.4 on x86_64-pc-linux-gnu", Citus: "12.1-1", CitusDistributed: true, Notify: notify},
			"Citus distributed table", "undistribute_table")
		require.Nil(t, JudgeServer(ServerInfo{Version: "PostgreSQL 16.4 on x86_64-pc-linux-gnu", Citus: "12.1-1", Notify: notify}),
			"a local table on the Citus coordinator is plain PostgreSQL")
		require.Nil(t, JudgeServer(ServerInfo{Version: "PostgreSQL 15.12-YB-2025.2.3.0-b1", Notify: notify}))
		for _, v := range []string{"8.0.30-Vitess", "5.7.9-vitess-10.0.0-SNAPSHOT", "11.4.2-MariaDB-ubu2404", "8.0.36",
			"PostgreSQL 16.4 (Debian 16.4-1.pgdg120+1) on x86_64-pc-linux-gnu"} {
			require.Nil(t, JudgeServer(ServerInfo{Version: v, Notify: notify}), v)
		}
	}
	ce := JudgeServer(ServerInfo{Version: "CockroachDB OSS v21.2.3 (x86_64-unknown-linux-gnu)"})
	require.ErrorContains(t, ce, "no SELECT ... FOR UPDATE SKIP LOCKED before v22.2")
	ce = JudgeServer(ServerInfo{Version: "CockroachDB CCL v22.2.0 (x86_64-unknown-linux-gnu)"})
	require.NotContains(t, ce.Error(), "SKIP LOCKED")

	refused(ServerInfo{Version: "PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-pc-linux-gnu", Notify: true},
		"YugabyteDB 2.18.0.0", "no LISTEN/NOTIFY before 2025.2.3", "DisableNotify: true")
	require.Nil(t, JudgeServer(ServerInfo{Version: "PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-pc-linux-gnu"}),
		"YugabyteDB without notifications")
}

func TestAtLeast(t *testing.T) {
	t.Parallel()
	require.True(t, atLeast("22.2", 22, 2))
	require.True(t, atLeast("22.2.0", 22, 2))
	require.True(t, atLeast("23.1.11", 22, 2))
	require.False(t, atLeast("22.1.22", 22, 2))
	require.False(t, atLeast("21", 22, 2))
	require.True(t, atLeast("2025.2.3.0", 2025, 2, 3))
	require.False(t, atLeast("2025.2", 2025, 2, 3))
	require.True(t, atLeast("2025.2", 2025, 2, 0))
	require.False(t, atLeast("x.y", 1))
	require.False(t, atLeast("", 1))
}
