// values.schema.json: Helm 3 validates the coalesced values against the chart's JSON Schema
// (with github.com/xeipuuv/gojsonschema, as here) before rendering anything.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/xeipuuv/gojsonschema"
)

func validateValuesSchema(chartDir, chartName string, values map[string]interface{}) error {
	schemaBytes, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	valuesJSON, err := json.Marshal(values)
	if err != nil {
		return err
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schemaBytes),
		gojsonschema.NewBytesLoader(valuesJSON))
	if err != nil {
		return fmt.Errorf("values.schema.json: %v", err)
	}
	if result.Valid() {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n", chartName)
	for _, e := range result.Errors() {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return fmt.Errorf("%s", strings.TrimSuffix(b.String(), "\n"))
}
