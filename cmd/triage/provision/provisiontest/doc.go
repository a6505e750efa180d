// Package provisiontest gives integration tests the application account
// a deployment's nodes log in as: created by provision.EnsureAccounts, as
// the bootstrap and the beds create it, on the test servers the shards are
// on. A node refuses root as its application account, so a test's node
// gets one of these.
package provisiontest
