package bucket_test

import (
	"os"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) {
	if os.Getenv(fleetWorkerEnv) != "" {
		os.Exit(fleetWorker())
	}
	if os.Getenv(faultWorkerEnv) != "" {
		os.Exit(faultWorker())
	}
	redistest.Main(m)
}
