# The public ABI: libecstore.so exports exactly what include/ecstore/ marks
# ECS_API (tests/abi_symbols.sh; needs nm from binutils).
find_program(ECS_NM nm)
if(ECS_NM)
  add_test(NAME test_abi_symbols
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/abi_symbols.sh $<TARGET_FILE:ecstore> ${CMAKE_SOURCE_DIR}/include/ecstore)
  set_tests_properties(test_abi_symbols PROPERTIES TIMEOUT 30 LABELS unit)
endif()
