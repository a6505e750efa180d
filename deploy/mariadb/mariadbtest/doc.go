// Package mariadbtest gives integration tests real MariaDB servers.
//
// A test package shares one mariadbd, started lazily on first use and stopped
// after all its tests, because starting a server costs about a second while a
// fresh database on a running one costs milliseconds. Tests that crash or
// restart a server get a dedicated one from [NewServer].
//
// A missing MariaDB is a test failure, never a skip: a skipped integration
// test looks green in CI and hides exactly the bugs these tests exist for.
//
// Usage:
//
//	func TestMain(m *testing.M) { os.Exit(mariadbtest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		t.Parallel()
//		db := sqlx.MustConnect("mysql", mariadbtest.Database(t))
//		...
//	}
package mariadbtest
