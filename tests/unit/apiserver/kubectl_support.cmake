# Unit tests of the test API server's patch formats, OpenAPI documents and
# Table printing (the parts kubectl exercises); included by CMakeLists.txt here.
tandem_add_test(NAME apiserver_patch_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/patch_test.cpp
  LIBS tandem_test_apiserver LABELS unit)
tandem_add_test(NAME apiserver_openapi_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/openapi_test.cpp
  LIBS tandem_test_apiserver LABELS unit)
# Reads crds/prefillpools.tandem.dev.yaml (TANDEM_SOURCE_DIR) for its printer columns.
tandem_add_test(NAME apiserver_table_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/table_test.cpp
  LIBS tandem_test_apiserver LABELS unit)
