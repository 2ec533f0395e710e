package gendurable_test

import (
	"testing"

	"github.com/gendurable/gendurable/durabledbtest"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }
